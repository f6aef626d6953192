"""The V1 engine: `TPUEmbedding` on TPUs v2-v4 (`v1_engine.py`)."""
