"""ember-kernels: the C kernel generators shared by ember's GPU backends.

Generators write kernels once, in the OpenCL C vocabulary; :mod:`ember_kernels.dialect` turns that text into an
OpenCL, CUDA (NVRTC) or HIP (hiprtc) program. ember-opencl runs the kernels on every CI run (on PoCL); the CUDA and
HIP texts are compiled by ``ember kernels check`` (ember-cupy). A library, not a plugin.
"""

from .dialect import CUDA, DIALECTS, HIP, OPENCL, Dialect, dialect

__version__ = "0.1.0"

__all__ = ["CUDA", "DIALECTS", "HIP", "OPENCL", "Dialect", "__version__", "dialect"]
