"""A custom op with its own kernels and gradient: ``linear_relu(x, w, b) = relu(x @ w.T + b)``.

The worked example of ``ember.backend_extension`` (docs: "Writing an extension"). One registration gives:

* the output spec: shape ``(*x.shape[:-1], w.shape[0])`` and x's dtype, known before anything runs;
* the default composition in ember ops, which runs on every device (fused, differentiated like any ember code);
* a flex kernel (numpy: one matmul into a fresh array, then the bias and the ReLU in place in it);
* an OpenCL kernel: a tiled GEMM whose epilogue adds the bias and applies the ReLU, one pass over the output;
* a backward (vjp), so that under autodiff the op is one graph node whatever kernel ran forward.

Run it: ``python examples/extensions/linear_relu.py [device]`` compares the op with numpy on a device.
Nothing here imports a plugin: kernels get the backend object and its handles (numpy arrays on flex, CLArrays on
OpenCL) and use only their public methods and attributes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

import ember
from ember import dtypes as dt
from ember.errors import DTypeError, ShapeError

OP = "examples.linear_relu"


def _output(x: ember.TensorSpec, w: ember.TensorSpec, b: ember.TensorSpec) -> ember.TensorSpec:
    """The shape rule: the result's shape and dtype from the arguments' specs alone, before anything runs (lazy
    devices record the op with it). It is also where bad arguments are refused, with typed errors, so neither the
    composition nor the kernels see them."""
    if x.ndim < 1 or w.ndim != 2 or b.ndim != 1:
        raise ShapeError(f"expected x of shape (..., in), w of shape (out, in) and b of shape (out,), got "
                         f"x {x.shape}, w {w.shape}, b {b.shape}")
    if x.shape[-1] != w.shape[1] or b.shape[0] != w.shape[0]:
        raise ShapeError(f"shapes do not match: x {x.shape}, w {w.shape}, b {b.shape} "
                         "(need x.shape[-1] == w.shape[1] and b.shape[0] == w.shape[0])")
    if not x.dtype == w.dtype == b.dtype or x.dtype is dt.bool_:
        raise DTypeError(f"x, w and b must share one numeric (non-bool) dtype, got {x.dtype.name}, "
                         f"{w.dtype.name} and {b.dtype.name}")
    return ember.TensorSpec((*x.shape[:-1], w.shape[0]), x.dtype)


@ember.backend_extension(OP, output=_output, method=None)
def linear_relu(x: ember.Tensor, w: ember.Tensor, b: ember.Tensor) -> ember.Tensor:
    """``relu(x @ w.T + b)``: x (..., in), w (out, in), b (out,) -> (..., out), of x's dtype.

    This body is the default composition: devices without their own kernel run it, op by op.
    """
    return ember.relu(x @ w.T + b)


# -- backward ---------------------------------------------------------------------------------------------------------
@linear_relu.save
def _save(ctx: Any, inputs: tuple[Any, ...], outputs: tuple[ember.Tensor, ...]) -> None:
    # PyTorch's setup_context: computes, from the recorded inputs and outputs, what the vjp needs beyond ctx.inputs
    # and ctx.outputs. Here the ReLU's mask, with torch's rule: the gradient is zero where the pre-activation is
    # <= 0 (out <= 0), and passes where it is NaN (NaN <= 0 is false).
    ctx.dead = outputs[0] <= 0


@linear_relu.vjp
def _vjp(ctx: Any, grad: ember.Tensor) -> tuple[ember.Tensor, ember.Tensor, ember.Tensor]:
    """Gradients of x, w and b from the output's gradient, in ember ops (they run on the op's device)."""
    x, w, _ = ctx.inputs
    g = ember.where(ctx.dead, 0, grad)  # through the ReLU
    n_out, n_in = w.shape
    g2, x2 = g.reshape(-1, n_out), x.reshape(-1, n_in)  # every batch dim flattened into rows
    return g @ w, g2.T @ x2, g2.sum(0)


# -- flex (numpy) -----------------------------------------------------------------------------------------------------
@linear_relu.kernel("flex")
def _flex(backend: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One fresh array (the matmul's), then the bias and the ReLU in place in it: one output-sized allocation where
    the composition makes three (the product, the sum, the ReLU). Half-precision and integer dtypes go through the
    backend's own primitives, which know their accumulation rules."""
    if backend.dtype_of(x) not in (dt.float32, dt.float64):
        return _primitives(backend, x, w, b)
    out = np.matmul(x, w.T)  # x @ w.T reads w transposed in place (BLAS), no copy
    out += b
    np.maximum(out, 0, out=out)  # NaN propagates, as in torch.relu
    return out


def _primitives(backend: Any, x: Any, w: Any, b: Any) -> Any:
    """The op in backend contract primitives (any backend, any numeric dtype): the kernels' fallback."""
    y = backend.binary("add", backend.matmul(x, backend.permute(w, (1, 0))), b)
    return backend.binary("maximum", y, 0)


# -- OpenCL -----------------------------------------------------------------------------------------------------------
_CL_TYPES = {dt.float32: "float", dt.float64: "double"}

# C = relu(X @ W^T + bias) for row-major X (M, K), W (N, K), bias (N), C (M, N). A work-group computes a TS x TS tile
# of C with TS x TS/WPT work-items, each holding WPT rows of one column in registers. Every K step stages a TS x TS
# tile of X and of W in local memory (coalesced loads along K, zero fill past the edges, so M, N and K need no
# padding; one padding column so reads down a tile column hit distinct banks); the epilogue adds the bias and
# applies the ReLU to the accumulators before the only store.
_CL_SOURCE = """{pragma}
#define T {ctype}
#define TS {ts}
#define WPT {wpt}
#define RTS (TS / WPT)
__kernel __attribute__((reqd_work_group_size(TS, RTS, 1)))
void ember_linear_relu(__global const T* X, long x_off, __global const T* W, long w_off,
                       __global const T* Bias, long b_off, __global T* C, long c_off, int M, int N, int K) {{
    __local T Xs[TS][TS + 1];
    __local T Ws[TS][TS + 1];
    const int col = get_local_id(0), row = get_local_id(1);
    const int m0 = get_group_id(1) * TS, n0 = get_group_id(0) * TS;
    T acc[WPT];
    for (int i = 0; i < WPT; ++i) acc[i] = 0;
    for (int k0 = 0; k0 < K; k0 += TS) {{
        const int k = k0 + col;
        for (int i = 0; i < WPT; ++i) {{
            const int r = row + i * RTS;
            Xs[r][col] = (m0 + r < M && k < K) ? X[x_off + (long)(m0 + r) * K + k] : (T)0;
            Ws[r][col] = (n0 + r < N && k < K) ? W[w_off + (long)(n0 + r) * K + k] : (T)0;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TS; ++kk) {{
            const T wv = Ws[col][kk];
            for (int i = 0; i < WPT; ++i) acc[i] += Xs[row + i * RTS][kk] * wv;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    const int n = n0 + col;
    if (n >= N) return;
    const T bias = Bias[b_off + n];
    for (int i = 0; i < WPT; ++i) {{
        const int m = m0 + row + i * RTS;
        if (m < M) {{
            const T v = acc[i] + bias;
            C[c_off + (long)m * N + n] = v < (T)0 ? (T)0 : v;  /* not fmax: a NaN must propagate, as in torch */
        }}
    }}
}}
"""

_WPT = 4  # rows per work-item


def _tile(rt: Any, itemsize: int) -> int | None:
    """The largest tile size whose work-group and two local tiles fit the device (None if not even 8 does)."""
    for ts in (32, 16, 8):
        if ts * ts // _WPT <= rt.max_work_group and 2 * ts * (ts + 1) * itemsize <= rt.local_mem:
            return ts
    return None


@linear_relu.kernel("opencl")
def _opencl(backend: Any, x: Any, w: Any, b: Any) -> Any:
    """The tiled GEMM with bias and ReLU in its epilogue, on CLArray handles (float32, and float64 where the
    device has it); other dtypes, sizes beyond the kernel's 32-bit indices and devices too small for an 8 x 8 tile
    use the backend's primitives."""
    dtype = backend.dtype_of(x)
    (n, k), m = w.shape, math.prod(x.shape[:-1])
    ts = _tile(backend.rt, dtype.itemsize) if dtype in _CL_TYPES and max(m, n, k) < 2**31 else None
    if ts is None:
        return _primitives(backend, x, w, b)
    # the kernel indexes rows densely: strided views (a transposed x, a sliced w) are copied once
    x, w, b = backend.contiguous(x), backend.contiguous(w), backend.contiguous(b)
    out = backend.empty((*x.shape[:-1], n), dtype)
    if m == 0 or n == 0:
        return out
    pragma = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" if dtype is dt.float64 else ""
    source = _CL_SOURCE.format(pragma=pragma, ctype=_CL_TYPES[dtype], ts=ts, wpt=_WPT)
    knl = backend.compile_kernel(source, "ember_linear_relu")  # built once per device, then a dict lookup
    grid = (-(-n // ts) * ts, -(-m // ts) * (ts // _WPT))
    i64, i32 = np.int64, np.int32
    knl(backend.rt.queue, grid, (ts, ts // _WPT), x.buf, i64(x.eoff), w.buf, i64(w.eoff), b.buf, i64(b.eoff),
        out.buf, i64(out.eoff), i32(m), i32(n), i32(k))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Compare the op with its composition on a device (default: ember's default device); print the difference."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    device = ember.Device.parse(args[0]) if args else ember.Device.default()
    ember.manual_seed(0)
    x = ember.randn(4, 37, 53, device=device)
    w = ember.randn(29, 53, device=device)
    b = ember.randn(29, device=device)
    fast = linear_relu(x, w, b).numpy()
    reference = np.maximum(x.numpy() @ w.numpy().T + b.numpy(), 0)
    print(f"{OP} on {device}: output {fast.shape}, max abs difference from numpy "
          f"{float(np.abs(fast - reference).max()):.2e}")


if __name__ == "__main__":
    main()
