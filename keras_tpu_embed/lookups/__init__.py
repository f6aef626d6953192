"""How ids become activations, behind one interface (`lookup_interfaces.py`).

Trainable lookups: `sparse.py` (sparse ops, any device) and `dense_xla.py`
(dense, XLA-compiled, the tensor core's form). Serving lookups on the host:
`padded_host.py` and `fused_host.py`, with the id checks they return in
`returned_checks.py`.
"""
