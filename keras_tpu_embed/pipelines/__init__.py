"""Input for the engine and for replicas, and what it tells about ids.

`distribute.py` (`kte.distribute_dataset`) splits a dataset per host
(`host_shares.py`) and cleans or densifies its ids there
(`host_ids.py`); `profiling.py` (`kte.profile_lookups`) counts the ids a
dataset sends each table, which SparseCore buffers are sized from.
"""
