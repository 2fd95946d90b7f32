"""ember-autodiff: reverse-mode differentiation as a device decorator.

``Device.flex().autodiff()`` resolves to ``AutodiffBackend(FlexBackend())``: every op of the contract runs on the
inner backend and, when an input requires grad, records a node with its vector-Jacobian product. ``backward()``
walks the recorded graph in reverse topological order. ``checkpointing="balanced"`` keeps the outputs of
compute-bound ops (matmul, convolution) and recomputes memory-bound ones (elementwise, reductions, views) in
backward.
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1
