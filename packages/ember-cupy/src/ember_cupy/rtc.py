"""Compilers for CUDA and HIP text that need no GPU: NVRTC through CuPy's binding, hiprtc through ctypes, and
clang's HIP front end and AMDGPU back end where hiprtc is absent.

NVRTC compiles to PTX for a virtual architecture without a driver or a device; it needs ``libnvrtc`` (the CUDA
toolkit, or the ``nvidia-cuda-nvrtc-cu12`` wheel, which CuPy finds). hiprtc is loaded from ``libhiprtc.so``
(ROCm), compiling for a ``gfx`` target. Without ROCm, :class:`ClangHIP` runs a plain ``clang`` (Debian's clang 14
will do: ``apt-get install clang``) as ``clang -x hip --cuda-device-only --offload-arch=gfx90a -nogpulib -nogpuinc
-S``: the same front end hiprtc is built on, through AMDGPU instruction selection to GCN assembly, with
:data:`HIP_RUNTIME_PRELUDE` standing in for the ``hip_runtime.h`` hiprtc provides implicitly. A compiler that cannot
be loaded is reported as :class:`Unavailable` with the reason, so ``ember kernels check`` can say why a target was
skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
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


#: What hiprtc's implicit ``hip_runtime.h`` gives a program and the dialect's prelude relies on, spelled on clang
#: built-ins for a compile without ROCm's headers (``-nogpuinc``): work-item geometry, barriers and fences, the
#: bit casts, integer high products, atomics, launch bounds and the small vector types (``uint4``, ``make_uint4``).
#: clang's own ``__clang_hip_runtime_wrapper.h`` (force-included, in its hiprtc mode ``__HIPCC_RTC__``) declares
#: the math library (``expf``, ``erfinv``, ``isnan`` overloads on ``__ocml_*``) as hiprtc does.
HIP_RUNTIME_PRELUDE = r"""
/* ember: hip_runtime.h stand-in (clang without ROCm) */
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define __EMBER_DIM3(name, fx, fy, fz) \
    struct __ember_##name##_t { \
        __declspec(property(get = get_x)) unsigned int x; \
        __declspec(property(get = get_y)) unsigned int y; \
        __declspec(property(get = get_z)) unsigned int z; \
        __device__ __forceinline__ unsigned int get_x() const { return fx; } \
        __device__ __forceinline__ unsigned int get_y() const { return fy; } \
        __device__ __forceinline__ unsigned int get_z() const { return fz; } \
    }; \
    static constexpr __device__ __ember_##name##_t name{};
__EMBER_DIM3(threadIdx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
             __builtin_amdgcn_workitem_id_z())
__EMBER_DIM3(blockIdx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
             __builtin_amdgcn_workgroup_id_z())
__EMBER_DIM3(blockDim, __builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
             __builtin_amdgcn_workgroup_size_z())
__EMBER_DIM3(gridDim, __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
             __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
             __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z())
__device__ __forceinline__ void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
__device__ __forceinline__ void __threadfence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }
__device__ __forceinline__ float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
__device__ __forceinline__ int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
__device__ __forceinline__ unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
__device__ __forceinline__ unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
__device__ __forceinline__ long long __mul64hi(long long a, long long b) {
    return (long long)(((__int128)a * b) >> 64);
}
template <typename T> __device__ __forceinline__ T atomicCAS(T* p, T cmp, T val) {
    __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
template <typename T> __device__ __forceinline__ T atomicAdd(T* p, T v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
#define __EMBER_VEC(T) \
    struct T##2 { T x, y; }; struct T##3 { T x, y, z; }; struct T##4 { T x, y, z, w; }; \
    __device__ __forceinline__ T##2 make_##T##2(T x, T y) { return {x, y}; } \
    __device__ __forceinline__ T##3 make_##T##3(T x, T y, T z) { return {x, y, z}; } \
    __device__ __forceinline__ T##4 make_##T##4(T x, T y, T z, T w) { return {x, y, z, w}; }
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
__EMBER_VEC(char) __EMBER_VEC(uchar) __EMBER_VEC(short) __EMBER_VEC(ushort) __EMBER_VEC(int) __EMBER_VEC(uint)
__EMBER_VEC(long) __EMBER_VEC(ulong) __EMBER_VEC(float) __EMBER_VEC(double)
"""

#: clang's driver flags for a HIP device-only compile to GCN assembly (no ROCm device libraries or headers; -S
#: stops before the lld link a code object would need, after instruction selection and register allocation)
_CLANG_FLAGS = ("-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc", "-D__HIPCC_RTC__", "-include",
                "__clang_hip_runtime_wrapper.h", "-std=c++17", "-S", "-Wno-unused-command-line-argument")
#: programs per clang invocation: the driver starts once for all of them (each is still its own translation unit)
_CLANG_BATCH = 24


class ClangHIP:
    """HIP device code compiled by a plain ``clang`` (no ROCm): the front end hiprtc wraps, and the AMDGPU back end
    to GCN assembly for one gfx target (clang's default device optimisation level; hiprtc's is -O3). Programs are
    batched, the batches run on every CPU core (``EMBER_HIP_JOBS`` overrides the count); a batch that fails is
    compiled file by file so every failure has its own log."""

    name = "clang"

    def __init__(self, arch: str = DEFAULT_HIP_ARCH, clang: str | None = None) -> None:
        path = clang or os.environ.get("EMBER_HIP_CLANG") or shutil.which("clang")
        if not path:
            raise Unavailable("neither hiprtc (libhiprtc.so, from ROCm) nor clang is installed here; apt-get install "
                              "clang (any clang >= 14 with the AMDGPU target) or install ROCm's hiprtc")
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
            targets = subprocess.run([path, "-print-targets"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"{path} does not run ({type(exc).__name__}: {exc})") from exc
        if "amdgcn" not in targets:
            raise Unavailable(f"{path} was built without the AMDGPU target (clang -print-targets lists no amdgcn)")
        first = out.splitlines()[0] if out else "clang"
        m = re.search(r"clang version (\S+)", first)
        self.path = path
        self.version = f"clang {m[1] if m else '?'}"
        self.options = (*_CLANG_FLAGS, f"--offload-arch={arch}")
        self.options_text = f"clang -x hip --cuda-device-only --offload-arch={arch} -nogpulib -nogpuinc -S"

    def _run(self, files: Sequence[str], extra: tuple[str, ...], cwd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.path, *self.options, *extra, *files], capture_output=True, text=True, cwd=cwd,
                              timeout=600)

    def compile(self, source: str, name: str, extra: tuple[str, ...] = ()) -> Result:
        return self.compile_many([(source, name)], extra)[0]

    def compile_many(self, programs: Sequence[tuple[str, str]], extra: tuple[str, ...] = ()) -> list[Result]:
        """Compile ``(source, name)`` programs sharing the options ``extra``; one :class:`Result` per program, in
        order."""
        from concurrent.futures import ThreadPoolExecutor

        jobs = max(1, int(os.environ.get("EMBER_HIP_JOBS") or os.cpu_count() or 1))
        with tempfile.TemporaryDirectory(prefix="ember-hip-") as tmp:
            files = []
            for i, (source, _) in enumerate(programs):
                f = f"p{i}.hip"
                with open(os.path.join(tmp, f), "w") as fh:
                    fh.write(HIP_RUNTIME_PRELUDE + source)
                files.append(f)

            def batch(files: list[str]) -> list[Result]:
                proc = self._run(files, extra, tmp)
                if proc.returncode == 0:
                    return [Result(True, "")] * len(files)  # warnings of a passing batch are not attributed
                out = []
                for f in files:  # find the failing programs and give each its own log
                    single = self._run([f], extra, tmp)
                    out.append(Result(single.returncode == 0, (single.stderr or single.stdout).strip()))
                return out

            batches = [files[i:i + _CLANG_BATCH] for i in range(0, len(files), _CLANG_BATCH)]
            with ThreadPoolExecutor(max_workers=min(jobs, len(batches) or 1)) as executor:
                return [r for rs in executor.map(batch, batches) for r in rs]


def compiler(target: str, arch: str | None = None) -> Compiler:
    """The compiler of ``target`` ("cuda" or "hip"); raises :class:`Unavailable` naming why it cannot load. For hip:
    hiprtc where ``libhiprtc.so`` loads, else clang where found (:class:`ClangHIP`)."""
    if target == "cuda":
        return NVRTC(arch or DEFAULT_CUDA_ARCH)
    if target == "hip":
        try:
            return HIPRTC(arch or DEFAULT_HIP_ARCH)
        except Unavailable as no_hiprtc:
            try:
                return ClangHIP(arch or DEFAULT_HIP_ARCH)
            except Unavailable as no_clang:
                raise Unavailable(f"{no_hiprtc}; {no_clang}") from no_clang
    from ember.errors import ValueRangeError

    raise ValueRangeError(f"ember kernels check: unknown target {target!r}; choose cuda or hip")
