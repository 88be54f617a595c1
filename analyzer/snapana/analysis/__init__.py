"""The analysis stages, in pipeline order: replay (the allocator state at any moment;
placement: would a request fit), attribution/ (block -> family), diagnosis/ (the findings
and the algorithm that makes them), knobs, family_timeline, explain; compare (two
captures) and ranks/ (many inputs) on top. Only the session wires them together.
"""
