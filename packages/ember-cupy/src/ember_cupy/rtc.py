"""Runtime compilers for CUDA and HIP text that need no GPU: NVRTC through CuPy's binding, hiprtc through ctypes.

NVRTC compiles to PTX for a virtual architecture without a driver or a device; it needs ``libnvrtc`` (the CUDA
toolkit, or the ``nvidia-cuda-nvrtc-cu12`` wheel, which CuPy finds). hiprtc is loaded from ``libhiprtc.so``
(ROCm), compiling for a ``gfx`` target. A compiler that cannot be loaded is reported as :class:`Unavailable`
with the reason, so ``ember kernels check`` can say why a target was skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Protocol

#: the default virtual architecture NVRTC compiles for (Turing: the oldest CUDA 13 supports; CUDA 12 deprecates
#: older ones)
DEFAULT_CUDA_ARCH = "compute_75"
#: the default AMD target (MI200, a common ROCm datacenter part)
DEFAULT_HIP_ARCH = "gfx90a"


class Unavailable(Exception):
    """The compiler of a target cannot be loaded here (the message says why and what to install)."""


@dataclass(frozen=True)
class Result:
    """One compilation: whether it succeeded and the compiler's log (warnings included)."""

    ok: bool
    log: str


class Compiler(Protocol):
    """A runtime compiler for one target language."""

    name: str
    version: str
    options_text: str

    def compile(self, source: str, name: str, extra: tuple[str, ...] = ()) -> Result:
        """Compile one program (``extra``: the dialect's options for it, see ``Dialect.options``); never raises
        for a program that does not compile (``ok`` is False)."""
        ...


class NVRTC:
    """NVRTC through ``cupy_backends.cuda.libs.nvrtc`` (PTX only: no driver or device needed)."""

    name = "nvrtc"

    def __init__(self, arch: str = DEFAULT_CUDA_ARCH) -> None:
        try:
            from cupy_backends.cuda.libs import nvrtc
        except ImportError as exc:
            raise Unavailable(f"CuPy is not installed ({exc}); pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12") \
                from exc
        try:
            major, minor = nvrtc.getVersion()
        except Exception as exc:  # CuPy imports without libnvrtc; the first call loads it
            raise Unavailable(f"libnvrtc cannot be loaded ({type(exc).__name__}: {exc}); "
                              "pip install nvidia-cuda-nvrtc-cu12 (or install the CUDA toolkit)") from exc
        self._nvrtc = nvrtc
        self.version = f"NVRTC {major}.{minor}"
        self.options = (f"--gpu-architecture={arch}", "--std=c++17")
        self.options_text = " ".join(self.options)

    def compile(self, source: str, name: str, extra: tuple[str, ...] = ()) -> Result:
        nvrtc = self._nvrtc
        prog = nvrtc.createProgram(source, f"{name.replace('/', '_')}.cu", [], [])
        try:
            try:
                nvrtc.compileProgram(prog, [*self.options, *extra])
                ok = True
            except nvrtc.NVRTCError:
                ok = False
            return Result(ok, nvrtc.getProgramLog(prog).rstrip("\x00").strip())
        finally:
            nvrtc.destroyProgram(prog)


class HIPRTC:
    """hiprtc from ROCm's ``libhiprtc.so`` through ctypes (code objects for one gfx target)."""

    name = "hiprtc"

    def __init__(self, arch: str = DEFAULT_HIP_ARCH) -> None:
        path = ctypes.util.find_library("hiprtc")
        candidates = [p for p in (path, "libhiprtc.so", "/opt/rocm/lib/libhiprtc.so") if p]
        lib = None
        errors = []
        for cand in candidates:
            try:
                lib = ctypes.CDLL(cand)
                break
            except OSError as exc:
                errors.append(str(exc))
        if lib is None:
            raise Unavailable("hiprtc is not installed here (libhiprtc.so not found: ROCm's hiprtc package, e.g. "
                              "apt install hiprtc, or a ROCm install under /opt/rocm, provides it)")
        self._lib = lib
        lib.hiprtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.hiprtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            raise Unavailable("libhiprtc.so loaded but hiprtcVersion failed")
        self.version = f"hiprtc {major.value}.{minor.value}"
        self.options = [f"--offload-arch={arch}".encode(), b"-std=c++17"]
        self.options_text = " ".join(o.decode() for o in self.options)

    def compile(self, source: str, name: str, extra: tuple[str, ...] = ()) -> Result:
        lib = self._lib
        prog = ctypes.c_void_p()
        status = lib.hiprtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name.replace('/', '_')}.hip"
                                         .encode(), 0, None, None)
        if status != 0:
            return Result(False, f"hiprtcCreateProgram: {lib.hiprtcGetErrorString(status).decode()}")
        try:
            options = [*self.options, *(o.encode() for o in extra)]
            opts = (ctypes.c_char_p * len(options))(*options)
            status = lib.hiprtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            lib.hiprtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(max(size.value, 1))
            lib.hiprtcGetProgramLog(prog, buf)
            return Result(status == 0, buf.value.decode(errors="replace").strip())
        finally:
            lib.hiprtcDestroyProgram(ctypes.byref(prog))


def compiler(target: str, arch: str | None = None) -> Compiler:
    """The compiler of ``target`` ("cuda" or "hip"); raises :class:`Unavailable` naming why it cannot load."""
    if target == "cuda":
        return NVRTC(arch or DEFAULT_CUDA_ARCH)
    if target == "hip":
        return HIPRTC(arch or DEFAULT_HIP_ARCH)
    from ember.errors import ValueRangeError

    raise ValueRangeError(f"ember kernels check: unknown target {target!r}; choose cuda or hip")
