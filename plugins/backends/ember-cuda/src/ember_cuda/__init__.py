"""ember-cuda: the NVIDIA CUDA backend for ember (Device.cuda(i)), on CuPy; the
implementation is shared with the other CuPy backend through the ember-cupy library."""

__version__ = "0.1.0"
CONTRACT = 1
