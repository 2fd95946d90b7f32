"""Dialects: one kernel text, emitted as OpenCL C, CUDA (NVRTC) or HIP (hiprtc).

The generators in this package write kernels in one vocabulary, the OpenCL C spelling: ``__kernel``/``__global``
qualifiers, ``get_global_id(d)`` and friends, ``__local`` arrays and ``barrier(CLK_LOCAL_MEM_FENCE)``,
``as_float``/``as_uint`` reinterpretation, ``vload_half``/``vstore_half_rte`` for float16 storage,
``atomic_cmpxchg``/``atom_cmpxchg`` and the overloaded math functions (``exp``, ``fabs``, ``fmin``, ``mad``,
``mul_hi``, ...). For OpenCL the text is the program, byte for byte (so ember-opencl's programs and on-disk cache keys
are what they were before the generators moved here). For CUDA and HIP :meth:`Dialect.program` prepends a prelude
that defines that vocabulary on top of the CUDA/HIP built-ins and rewrites the few constructs a prelude cannot
express:

* ``static inline`` helper functions become ``__device__ __forceinline__`` functions (not static: an unused one
  draws no warning);
* a ``__local T* name`` kernel parameter (work-group memory sized by the launch) becomes a pointer into the block's
  dynamic shared memory: the first such parameter starts at byte 0, each later one at a byte offset passed in its
  place as ``long name_smem`` (the launcher passes the offsets and the total as the shared-memory size);
* ``__attribute__((reqd_work_group_size(x, y, z)))`` becomes ``__launch_bounds__(x*y*z)``;
* vector literals ``(uint4)(a, b, c, d)`` become ``make_uint4(a, b, c, d)`` and lanes ``.s0``-``.s3`` become
  ``.x``-``.w`` (the small vectors Philox uses; arithmetic on vectors is not translated).

Vector types (``float4``, ``vload4``, ``.s0``, ``convert_float4``) have no CUDA/HIP spelling with OpenCL's
arithmetic; generators ask :attr:`Dialect.vectors` and emit scalar code (vector width 1) when it is false.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CUDA", "DIALECTS", "HIP", "OPENCL", "Dialect", "dialect"]

# The OpenCL vocabulary on CUDA and HIP built-ins. `long` is 64-bit on every target (LP64 Linux; NVRTC and hiprtc
# follow the host), as OpenCL's is.
_COMMON = r"""
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
/* float16 storage only, as OpenCL without cl_khr_fp16: moved with vload_half / vstore_half_rte, computed in float */
typedef unsigned short half;
#define __kernel extern "C" __global__
#define __global
#define __constant
#define __private
#define __local __shared__
#define restrict __restrict__
#define CLK_LOCAL_MEM_FENCE 1
#define CLK_GLOBAL_MEM_FENCE 2
#define barrier(flags) __syncthreads()
#define mem_fence(flags) __threadfence()
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)
#endif
#define MAXFLOAT 3.402823466e+38f
#define FLT_MAX 3.402823466e+38f
#define FLT_MIN 1.175494351e-38f
#define DBL_MAX 1.7976931348623158e+308
#define DBL_MIN 2.2250738585072014e-308
#define FLT_EPSILON 1.192092896e-07f
#define DBL_EPSILON 2.220446049250313e-16
#define M_PI_F 3.14159274101257f
#define M_PI 3.141592653589793
#define M_E_F 2.71828174591064f
#define M_LN2_F 0.693147182464599f
#define M_SQRT2_F 1.41421353816986f
#define M_SQRT1_2_F 0.707106769084930f
#define CHAR_BIT 8
#define CHAR_MAX 127
#define CHAR_MIN (-128)
#define SCHAR_MAX 127
#define SCHAR_MIN (-128)
#define UCHAR_MAX 255
#define SHRT_MAX 32767
#define SHRT_MIN (-32768)
#define USHRT_MAX 65535
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 0xffffffffu
#define LONG_MAX 0x7fffffffffffffffL
#define LONG_MIN (-0x7fffffffffffffffL - 1L)
#define ULONG_MAX 0xffffffffffffffffUL

/* work-item geometry: OpenCL's NDRange on CUDA's grid of blocks */
__device__ __forceinline__ size_t get_local_id(uint d) {
    return d == 0 ? threadIdx.x : d == 1 ? threadIdx.y : threadIdx.z;
}
__device__ __forceinline__ size_t get_group_id(uint d) {
    return d == 0 ? blockIdx.x : d == 1 ? blockIdx.y : blockIdx.z;
}
__device__ __forceinline__ size_t get_local_size(uint d) {
    return d == 0 ? blockDim.x : d == 1 ? blockDim.y : blockDim.z;
}
__device__ __forceinline__ size_t get_num_groups(uint d) {
    return d == 0 ? gridDim.x : d == 1 ? gridDim.y : gridDim.z;
}
__device__ __forceinline__ size_t get_global_id(uint d) {
    return get_group_id(d) * get_local_size(d) + get_local_id(d);
}
__device__ __forceinline__ size_t get_global_size(uint d) {
    return get_num_groups(d) * get_local_size(d);
}

/* as_<type>: reinterpret the bits of a value of the same size */
template <typename To, typename From> __device__ __forceinline__ To ember_bits(From x) {
    static_assert(sizeof(To) == sizeof(From), "as_<type> needs operands of equal size");
    union { From f; To t; } u;
    u.f = x;
    return u.t;
}
#define as_char(x) ember_bits<char>(x)
#define as_uchar(x) ember_bits<uchar>(x)
#define as_short(x) ember_bits<short>(x)
#define as_ushort(x) ember_bits<ushort>(x)
#define as_int(x) ember_bits<int>(x)
#define as_uint(x) ember_bits<uint>(x)
#define as_long(x) ember_bits<long>(x)
#define as_ulong(x) ember_bits<ulong>(x)
#define as_float(x) ember_bits<float>(x)
#define as_double(x) ember_bits<double>(x)

/* integer and float helpers OpenCL has built in */
__device__ __forceinline__ uint mul_hi(uint a, uint b) { return __umulhi(a, b); }
__device__ __forceinline__ ulong mul_hi(ulong a, ulong b) {
    return (ulong)__umul64hi((unsigned long long)a, (unsigned long long)b);
}
__device__ __forceinline__ long mul_hi(long a, long b) { return (long)__mul64hi((long long)a, (long long)b); }
__device__ __forceinline__ float mad(float a, float b, float c) { return a * b + c; }
__device__ __forceinline__ double mad(double a, double b, double c) { return a * b + c; }
template <typename T> __device__ __forceinline__ T clamp(T x, T lo, T hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}
template <typename T, typename C> __device__ __forceinline__ T select(T a, T b, C c) { return c ? b : a; }
__device__ __forceinline__ long min(long a, long b) { return a < b ? a : b; }
__device__ __forceinline__ long max(long a, long b) { return a > b ? a : b; }
__device__ __forceinline__ ulong min(ulong a, ulong b) { return a < b ? a : b; }
__device__ __forceinline__ ulong max(ulong a, ulong b) { return a > b ? a : b; }
#ifndef __HIP__  /* clang's HIP cmath (which hiprtc includes too) already defines abs(long) */
__device__ __forceinline__ long abs(long a) { return a < 0 ? -a : a; }
#endif
__device__ __forceinline__ short abs(short a) { return (short)(a < 0 ? -a : a); }
__device__ __forceinline__ char abs(char a) { return (char)(a < 0 ? -a : a); }
__device__ __forceinline__ uint convert_uint(float x) { return (uint)x; }

/* atomics: OpenCL 1.x names on CUDA/HIP's atomicCAS / atomicAdd */
__device__ __forceinline__ uint atomic_cmpxchg(volatile uint* p, uint cmp, uint val) {
    return atomicCAS((unsigned int*)p, cmp, val);
}
__device__ __forceinline__ int atomic_cmpxchg(volatile int* p, int cmp, int val) {
    return atomicCAS((int*)p, cmp, val);
}
__device__ __forceinline__ ulong atom_cmpxchg(volatile ulong* p, ulong cmp, ulong val) {
    return (ulong)atomicCAS((unsigned long long*)p, (unsigned long long)cmp, (unsigned long long)val);
}
__device__ __forceinline__ long atom_cmpxchg(volatile long* p, long cmp, long val) {
    return (long)atomicCAS((unsigned long long*)p, (unsigned long long)cmp, (unsigned long long)val);
}
__device__ __forceinline__ int atomic_add(volatile int* p, int v) { return atomicAdd((int*)p, v); }
__device__ __forceinline__ uint atomic_add(volatile uint* p, uint v) { return atomicAdd((unsigned int*)p, v); }
__device__ __forceinline__ int atomic_inc(volatile int* p) { return atomicAdd((int*)p, 1); }
__device__ __forceinline__ uint atomic_inc(volatile uint* p) { return atomicAdd((unsigned int*)p, 1u); }
"""

# float16 conversions, round to nearest even (OpenCL's vstore_half_rte), per target
_HALF_CUDA = r"""
__device__ __forceinline__ float vload_half(size_t i, const half* p) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i]));
    return f;
}
__device__ __forceinline__ void vstore_half_rte(float v, size_t i, half* p) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
}
__device__ __forceinline__ void vstore_half_rte(double v, size_t i, half* p) {
    unsigned short h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(v));
    p[i] = h;
}
"""

_HALF_HIP = r"""
__device__ __forceinline__ float vload_half(size_t i, const half* p) {
    return (float)ember_bits<_Float16>(p[i]);
}
__device__ __forceinline__ void vstore_half_rte(float v, size_t i, half* p) {
    p[i] = ember_bits<ushort>((_Float16)v);
}
__device__ __forceinline__ void vstore_half_rte(double v, size_t i, half* p) {
    p[i] = ember_bits<ushort>((_Float16)v);
}
"""

_PRAGMA = re.compile(r"^\s*#pragma OPENCL (?:EXTENSION|FP_CONTRACT)[^\n]*\n", re.M)
_NO_CONTRACT = "#pragma OPENCL FP_CONTRACT OFF"
_VECTOR_LITERAL = re.compile(r"\((u?(?:char|short|int|long)|float|double)([234])\)\(")
_LANE = re.compile(r"\.s([0-3])\b")
_STATIC_INLINE = re.compile(r"\bstatic\s+inline\b")
_REQD = re.compile(r"__attribute__\(\(reqd_work_group_size\((\d+),\s*(\d+),\s*(\d+)\)\)\)")
# a kernel's signature: `__kernel [launch bounds] void NAME(params) {`
_SIGNATURE = re.compile(r"__kernel\s+((?:__launch_bounds__\(\d+\)\s+)?)void\s+(\w+)\s*\(([^)]*)\)\s*\{")
_LOCAL_POINTER = re.compile(r"__local\s+([\w ]+?)\s*\*")
_LOCAL_PARAM = re.compile(r"^\s*__local\s+([\w ]+?)\s*\*\s*(\w+)\s*$")


@dataclass(frozen=True)
class Dialect:
    """How kernel text in the shared vocabulary becomes a program of one target language."""

    name: str  #: "opencl", "cuda" or "hip"
    vectors: bool  #: OpenCL vector types and vload/vstore<n> available (else generators emit scalar code)
    fp64_pragma: str  #: what a program using double starts with

    def program(self, source: str) -> str:
        """The complete program text of ``source`` (kernels in the shared vocabulary) in this dialect."""
        if self.name == "opencl":
            return source
        # OpenCL pragmas: double is core on CUDA/HIP; FP_CONTRACT OFF becomes a compile option (see options())
        source = _PRAGMA.sub("", source)
        source = _STATIC_INLINE.sub("__device__ __forceinline__", source)
        source = _REQD.sub(lambda m: f"__launch_bounds__({int(m[1]) * int(m[2]) * int(m[3])})", source)
        source = _SIGNATURE.sub(_shared_params, source)
        # other __local pointers (helper parameters, casts) are generic pointers; __local arrays stay __shared__
        source = _LOCAL_POINTER.sub(lambda m: m[1] + "*", source)
        # OpenCL vector literals and lane names on CUDA/HIP's vector structs (uint4: .x .y .z .w)
        source = _VECTOR_LITERAL.sub(lambda m: f"make_{m[1]}{m[2]}(", source)
        source = _LANE.sub(lambda m: "." + "xyzw"[int(m[1])], source)
        half = _HALF_CUDA if self.name == "cuda" else _HALF_HIP
        return f"/* ember: {self.name} dialect prelude */\n{_COMMON}{half}/* ember: kernels */\n{source}"

    def options(self, source: str) -> tuple[str, ...]:
        """Compiler options ``source`` needs in this dialect: a program asking for no floating-point contraction
        (``#pragma OPENCL FP_CONTRACT OFF``: a * b + c rounded twice, as the reference computes it) compiles with
        ``--fmad=false`` on NVRTC and ``-ffp-contract=off`` on hiprtc; OpenCL reads the pragma itself."""
        if self.name == "opencl" or _NO_CONTRACT not in source:
            return ()
        return ("--fmad=false",) if self.name == "cuda" else ("-ffp-contract=off",)

    @property
    def shared_memory_note(self) -> str:
        """How a launcher passes ``__local T*`` parameters in this dialect (for error messages and docs)."""
        if self.name == "opencl":
            return "a cl.LocalMemory(nbytes) argument per __local parameter"
        return ("dynamic shared memory: the first __local parameter at byte 0, each later one at the byte offset "
                "passed in its place as `long <name>_smem`; the launch's shared-memory size is the total")


def _shared_params(m: re.Match[str]) -> str:
    """Rewrite one kernel signature's ``__local T* name`` parameters into pointers into dynamic shared memory."""
    bounds, name, params = m[1], m[2], m[3]
    kept: list[str] = []
    carve: list[str] = []
    first = True
    for p in params.split(","):
        local = _LOCAL_PARAM.match(p)
        if local is None:
            kept.append(p.strip())
            continue
        ctype, var = local[1].strip(), local[2]
        if first:
            carve.append(f"{ctype}* {var} = ({ctype}*)ember_smem;")
            first = False
        else:
            kept.append(f"long {var}_smem")
            carve.append(f"{ctype}* {var} = ({ctype}*)(ember_smem + {var}_smem);")
    head = f"__kernel {bounds}void {name}({', '.join(kept)}) {{"
    if not carve:
        return head
    # 16-byte alignment covers every element type, double and long included
    return head + "\n    extern __shared__ __align__(16) unsigned char ember_smem[];\n    " + "\n    ".join(carve)


OPENCL = Dialect("opencl", vectors=True, fp64_pragma="#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n")
CUDA = Dialect("cuda", vectors=False, fp64_pragma="")
HIP = Dialect("hip", vectors=False, fp64_pragma="")
DIALECTS: dict[str, Dialect] = {d.name: d for d in (OPENCL, CUDA, HIP)}


def dialect(name: str) -> Dialect:
    """The dialect called ``name`` ("opencl", "cuda" or "hip"); a ValueRangeError names the choices otherwise."""
    try:
        return DIALECTS[name]
    except KeyError:
        from ember.errors import ValueRangeError

        raise ValueRangeError(f"ember_kernels.dialect: unknown dialect {name!r}; choose one of "
                              f"{sorted(DIALECTS)}") from None
