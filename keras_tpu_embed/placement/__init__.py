"""Where each table lives and what every stage agrees on about ids.

`hardware.py` probes the TPU in scope, `devices.py` names a lookup device
(`LookupDevice`), `device_plan.py` decides each table's devices once per
phase, and `ids.py` holds the one form of ids and their checks. Columns,
preprocessing, lookups and engines all read these, so they sit below them.
"""
