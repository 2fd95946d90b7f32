"""The dtype <-> C type table, now shared with the CUDA/HIP backends: it lives in ember_kernels.ctypes_."""

from ember_kernels.ctypes_ import CTYPES, FP64_PRAGMA, PREAMBLE, CType, ctype, float_literals, header

__all__ = ["CTYPES", "FP64_PRAGMA", "PREAMBLE", "CType", "ctype", "float_literals", "header"]
