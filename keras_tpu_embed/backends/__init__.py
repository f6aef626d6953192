"""Where a layer's tables live when no embedding engine holds them.

`embedding_step.py` gives each update its step count and learning rate
(the engines read it too); `layer_variables.py` names a layer's variables
in a `.keras` file, whichever backend holds them.
"""
