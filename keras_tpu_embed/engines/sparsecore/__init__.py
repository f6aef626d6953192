"""The SparseCore engine: `TPUEmbeddingV2` on v5p, v6e and later, with its
buffer sizes (`sparsecore_buffers.py`) and the lookup profiles they are
sized from (`profile_files.py`)."""
