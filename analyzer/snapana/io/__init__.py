"""Writing files: atomic `output`, the public `tables` and their Parquet `export`, the
`rank_dataset`, the memray `convert`er (a sidecar is read by `sources.sidecar`).
Writers, not renderers: they format nothing for a reader.
"""
