"""The `snapana` commands, one small module each, over one shared input/output policy
(`_policy.py`: inputs → sessions → one rule for the rank shown in full → render → atomic
write) and one set of options (`_options.py`). `snapana.cli` registers them on the typer app
and maps errors to exit codes; a command parses its options and calls the policy.

Each command imports the pipeline inside its function, so `snapana -h` and `-V` stay fast.
"""
