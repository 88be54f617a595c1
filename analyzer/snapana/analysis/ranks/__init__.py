"""Many inputs of one job: `aggregate` (rank statistics and the one rule for the rank shown
in full) and `runner` (the inputs `inputs.resolve` told, each reduced to a summary in worker
processes).
"""
