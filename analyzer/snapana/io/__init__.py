"""Reading a sidecar and writing files: atomic `output`, the `sidecar_reader`, the public
`tables` and their Parquet `export`, the `rank_dataset`, the memray `convert`er.
Writers, not renderers: they format nothing for a reader.
"""
