"""Everything that writes or reads a model's state to and from files.

`checkpoints.py` (the engine's tables in TF checkpoints, restored and
checked), `checkpoint_rows.py` (a stored table read a slice at a time),
`warm_start.py` (tables from feature-column and TPUEstimator checkpoints),
`loading.py` (loaders that name a damaged file) and `export_records.py`
(the digests and table dtype an export records beside its files).
"""
