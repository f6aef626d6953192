"""SavedModel exports that serve raw features with TensorFlow alone.

`serving.py` builds the export; its signatures take what
`serving_inputs.py` says, preprocessed by the model's own columns
(`column_preprocessor.py`); `joined_lookups.py` runs a layer's host
lookups as one program and `compiled_model.py` the model past its lookups
compiled with XLA.
"""
