"""ember-cupy: the CuPy implementation shared by ember's CUDA (ember-cuda) and ROCm (ember-rocm) backends, and the
``ember kernels check`` command that compiles the shared kernels with NVRTC / hiprtc without a GPU.

A library, not a plugin: the two plugins register the backends; this package never imports CuPy at import time.
"""

__version__ = "0.1.0"
