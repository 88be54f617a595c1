"""The diagnosis: `findings` (the typed, frozen vocabulary every renderer reads) and
`diagnose` (the algorithm that computes them; no renderer imports it).
"""
