"""The TPU embedding engines: TF's mid-level objects, one per strategy.

`engine_registry.py` picks the engine for the hardware in scope: `v1/`
(`TPUEmbedding`, TPU v2-v4) or `sparsecore/` (`TPUEmbeddingV2`). What they
share: `conversion.py` (columns to TF's table and feature configs),
`engine_members.py` (the layers and tables registered with an engine),
`engine_step.py` (one training step's lookups and updates),
`engine_checks.py` and `engine_host_ids.py` (ids checked and cleaned on
the host before the engine takes them).
"""
