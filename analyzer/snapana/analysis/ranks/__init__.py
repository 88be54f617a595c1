"""Many inputs of one job: `aggregate` (rank statistics and the one rule for the rank shown
in full) and `runner` (inputs expanded, each reduced to a summary in worker processes).
"""
