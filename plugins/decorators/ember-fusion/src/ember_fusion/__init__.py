"""ember-fusion: lazy op recording, fused kernels and a plan cache that replays graphs.

With this plugin installed, every device whose backend implements :meth:`ember.backend.Backend.fusion_compile`
resolves to ``FusionBackend(<backend>)`` (under any other decorator: ``Autodiff(Fusion(OpenCL))``). Elementwise
ops, casts, fills and reductions are recorded into a graph instead of running; a read, a sync, an in-place write,
an op the decorator does not record, or the size bound runs the pending graph as fused kernels. The partition of a
graph into kernels is cached by the graph's relative form (:func:`ember.ir.relative_form`), so a graph seen before
replays its plan without re-analysis. Ops on small values in memory (fewer than ``eager_below`` elements)
run at once instead. ``device.fusion(False)`` or ``EMBER_FUSION=0`` turns it off.
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1
