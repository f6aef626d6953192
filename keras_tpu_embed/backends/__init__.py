"""Where a layer's tables live when no embedding engine holds them.

`table_backend.py` is what every backend gives the layer (an engine is one
too), `local_tables.py` the tables the layer holds itself, trained through
`gradient_trap.py` (how Keras' gradients reach their rows) and, under a
replicated strategy, `replicas.py` (one update from every replica's rows).
`embedding_step.py` gives each update its step count and learning rate,
and `layer_variables.py` names a layer's variables in a `.keras` file.
`serving_tables.py` holds what one export serves instead (quantized
copies, the engine's tables read from the chip), apart from the layer.
"""
