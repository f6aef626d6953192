"""The tables themselves: their specs, how they are made, how they are stored.

`table_specs.py` groups columns into tables (`TableSpec`), `initialization.py`
makes a table's values a block or a shard at a time, `quantization.py`
stores serving tables as bfloat16 or row-wise int8, and the `sparsecore_*`
modules lay a table out as SparseCore shards and checkpoints it.
"""
