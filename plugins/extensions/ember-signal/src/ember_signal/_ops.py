"""The three transforms every ember.fft function is made of, as extension ops with vjps.

* ``signal.c2c(x, s=, dims=, norm=, forward=)``: the n-dimensional complex FFT (or its inverse) over ``dims``, the
  input cropped or zero-padded to sizes ``s`` first; real input gives a complex result (its gradient is real).
* ``signal.r2c(x, s=, dims=, norm=)``: the one-sided real FFT (``rfftn``): the last of ``dims`` keeps
  ``s[-1] // 2 + 1`` bins.
* ``signal.c2r(x, s=, dims=, norm=)``: its inverse (``irfftn``): a Hermitian half spectrum to a real signal whose last
  transformed dim has ``s[-1]`` points.

``s`` and ``dims`` arrive resolved (ints, non-negative dims); ``norm`` is ``"backward"``, ``"forward"`` or
``"ortho"``. Kernels: ember-flex through scipy.fft (pocketfft; float32 stays single precision), registered by
:mod:`ember_signal.flex_kernels`. Other backends run the default composition: the host's scipy.fft on a host copy,
the result copied back -- a backend that cannot store complex numbers raises a DTypeError naming the dtype.

The vjps are PyTorch's (``fft_c2c_backward``, ``fft_r2c_backward``, ``fft_c2r_backward``): the adjoint of a
transform with one norm is the opposite transform with the dual norm (backward <-> forward, ortho stays), cropping
and zero-padding are each other's adjoints, and c2r's adjoint doubles the bins that stand for two conjugate ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ember
from ember import dtypes as dt
from ember.errors import DTypeError
from ember.extension import TensorSpec, backend_extension

DUAL_NORM = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _shape_with(shape: tuple[int, ...], dims: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, ...]:
    out = list(shape)
    for d, n in zip(dims, sizes):
        out[d] = n
    return tuple(out)


def _c2c_spec(x: TensorSpec, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str, forward: bool) -> TensorSpec:
    return TensorSpec(_shape_with(x.shape, dims, s), x.dtype.to_complex)


def _r2c_spec(x: TensorSpec, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> TensorSpec:
    if x.dtype.is_complex:
        raise DTypeError(f"rfft: expects a real input tensor, got {x.dtype.name}")
    return TensorSpec(_shape_with(x.shape, dims, s[:-1] + (s[-1] // 2 + 1,)), x.dtype.to_complex)


def _c2r_spec(x: TensorSpec, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> TensorSpec:
    return TensorSpec(_shape_with(x.shape, dims, s), x.dtype.to_real)


def host_c2c(a: np.ndarray, s: tuple[int, ...], dims: tuple[int, ...], norm: str, forward: bool) -> np.ndarray:
    """scipy.fft.fftn / ifftn (pocketfft) on a host array."""
    import scipy.fft as sf

    f = sf.fftn if forward else sf.ifftn
    return np.ascontiguousarray(f(a, s=s, axes=dims, norm=norm))


def host_r2c(a: np.ndarray, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> np.ndarray:
    """scipy.fft.rfftn on a host array."""
    import scipy.fft as sf

    return np.ascontiguousarray(sf.rfftn(a, s=s, axes=dims, norm=norm))


def host_c2r(a: np.ndarray, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> np.ndarray:
    """scipy.fft.irfftn on a host array."""
    import scipy.fft as sf

    return np.ascontiguousarray(sf.irfftn(a, s=s, axes=dims, norm=norm))


def _host_fallback(op: str, x: ember.Tensor, spec: TensorSpec, arr: np.ndarray) -> ember.Tensor:
    """A host result put on x's device: the composition of a backend without a kernel for the op."""
    dev = x.device
    if not dev.supports_dtype(spec.dtype):
        raise DTypeError(f"{op}: the result dtype {spec.dtype} is not supported by backend "
                         f"{dev.stack.base_backend.name!r} (device {dev}); run the transform on a device that stores "
                         "complex numbers (flex)")
    return ember.tensor(np.ascontiguousarray(arr, dtype=spec.dtype.numpy), device=dev)


@backend_extension("signal.c2c", output=_c2c_spec, publish=False)
def c2c(x: ember.Tensor, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str, forward: bool) -> ember.Tensor:
    """n-dimensional complex FFT (forward) or inverse FFT over dims, the input resized to s first."""
    spec = _c2c_spec(TensorSpec.of(x), s=s, dims=dims, norm=norm, forward=forward)
    return _host_fallback("fft", x, spec, host_c2c(x.numpy(), s, dims, norm, forward))


@backend_extension("signal.r2c", output=_r2c_spec, publish=False)
def r2c(x: ember.Tensor, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> ember.Tensor:
    """n-dimensional one-sided real FFT (rfftn) over dims, the input resized to s first."""
    spec = _r2c_spec(TensorSpec.of(x), s=s, dims=dims, norm=norm)
    return _host_fallback("rfft", x, spec, host_r2c(x.numpy(), s, dims, norm))


@backend_extension("signal.c2r", output=_c2r_spec, publish=False)
def c2r(x: ember.Tensor, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> ember.Tensor:
    """n-dimensional inverse of rfftn (irfftn) over dims: real output with sizes s."""
    spec = _c2r_spec(TensorSpec.of(x), s=s, dims=dims, norm=norm)
    return _host_fallback("irfft", x, spec, host_c2r(x.numpy(), s, dims, norm))


def resize(g: ember.Tensor, dims: tuple[int, ...], sizes: tuple[int, ...]) -> ember.Tensor:
    """g cropped (leading part kept) or zero-padded at the end along each of dims to sizes (the adjoint pair of
    the FFTs' n/s argument)."""
    for d, n in zip(dims, sizes):
        have = g.shape[d]
        if have > n:
            g = g.narrow(d, 0, n)
        elif have < n:
            pad_shape = list(g.shape)
            pad_shape[d] = n - have
            g = ember.cat([g, ember.zeros(pad_shape, dtype=g.dtype, device=g.device)], dim=d)
    return g


@c2c.vjp
def _(ctx: Any, g: ember.Tensor) -> tuple[ember.Tensor]:
    (x,) = ctx.inputs
    k = ctx.kwargs
    dims = k["dims"]
    gx = c2c(g, s=tuple(g.shape[d] for d in dims), dims=dims, norm=DUAL_NORM[k["norm"]], forward=not k["forward"])
    gx = resize(gx, dims, tuple(x.shape[d] for d in dims))
    return (gx if x.dtype.is_complex else ember.real(gx),)


@r2c.vjp
def _(ctx: Any, g: ember.Tensor) -> tuple[ember.Tensor]:
    # torch's fft_r2c_backward is real(ifftn(g zero-padded to the full spectrum)). The same in half the work: with
    # Z = [g, 0, ...], real(ifft(Z)) = ifft(Z + conj(Z mirrored)) / 2, and Z + conj(Z mirrored) is the Hermitian
    # spectrum whose half is g with its DC (and, for even n, Nyquist) bin doubled in real part -- so the gradient is
    # irfftn of g scaled by 1/2 except at those bins (c2r reads only their real part). Over several dims the other
    # dims are full complex transforms, which the mirror argument leaves unchanged.
    (x,) = ctx.inputs
    k = ctx.kwargs
    dims, s = k["dims"], k["s"]
    n, half = s[-1], g.shape[dims[-1]]
    w = np.full(half, 0.5, dtype=g.dtype.to_real.numpy)
    w[0] = 1
    if n % 2 == 0:
        w[-1] = 1
    shape = [1] * g.ndim
    shape[dims[-1]] = half
    gx = c2r(g * ember.tensor(w.reshape(shape), device=g.device), s=s, dims=dims, norm=DUAL_NORM[k["norm"]])
    return (resize(gx, dims, tuple(x.shape[d] for d in dims)),)


@c2r.vjp
def _(ctx: Any, g: ember.Tensor) -> tuple[ember.Tensor]:
    (x,) = ctx.inputs
    k = ctx.kwargs
    dims, s = k["dims"], k["s"]
    gx = r2c(g, s=s, dims=dims, norm=DUAL_NORM[k["norm"]])
    n, half = s[-1], gx.shape[dims[-1]]
    doubled = n - half  # bins 1..doubled stand for themselves and their conjugate mirror
    if doubled > 0:
        w = np.ones(half, dtype=gx.dtype.to_real.numpy)
        w[1:1 + doubled] = 2
        shape = [1] * gx.ndim
        shape[dims[-1]] = half
        gx = gx * ember.tensor(w.reshape(shape), device=gx.device)
    gx = resize(gx, dims, tuple(x.shape[d] for d in dims))
    return (gx if x.dtype.is_complex else ember.real(gx),)


# -- framing for stft: the frames of a signal times the window, in one pass -------------------------------------------
#: the centre paddings the framing op does itself (the others go through F.pad first)
FRAME_PADS = ("constant", "reflect")


def _frames_spec(x: TensorSpec, window: TensorSpec, *, n_fft: int, hop: int, pad: int = 0,
                 pad_mode: str = "constant") -> TensorSpec:
    count = (x.shape[-1] + 2 * pad - n_fft) // hop + 1
    return TensorSpec((*x.shape[:-1], count, n_fft), dt.promote_types(x.dtype, window.dtype))


@backend_extension("signal.frames", output=_frames_spec, publish=False)
def frames(x: ember.Tensor, window: ember.Tensor, *, n_fft: int, hop: int, pad: int = 0,
           pad_mode: str = "constant") -> ember.Tensor:
    """The windowed frames of x (..., L) padded by ``pad`` samples at each end (zeros, or ``"reflect"``: mirrored
    without the edge, ``0 < pad < L``): (..., T, n_fft) with frame t = padded[..., t*hop : t*hop + n_fft] * window.

    The composition (any backend) is ``F.pad`` then ``unfold(-1, n_fft, hop) * window``; ember-flex's kernel pads
    with one concatenation and writes the product straight from a strided view, without materialising the unfolded
    copy first.
    """
    if pad:
        import ember.nn.functional as F

        shape = tuple(x.shape)
        x = F.pad(x.reshape(1, -1, shape[-1]), (pad, pad), mode=pad_mode).reshape(*shape[:-1], shape[-1] + 2 * pad)
    return x.unfold(-1, n_fft, hop) * window


def _unpad_grad(gp: ember.Tensor, length: int, pad: int, mode: str) -> ember.Tensor:
    """The gradient of x from that of its padded copy (..., length + 2 pad): the middle, plus for ``reflect`` the
    mirrored ends added back onto x[1 .. pad] and x[length - 1 - pad .. length - 2]."""
    import ember.nn.functional as F

    core = gp.narrow(-1, pad, length)
    if mode == "reflect" and pad:
        left = gp.narrow(-1, 0, pad).flip(-1)
        right = gp.narrow(-1, length + pad, pad).flip(-1)
        core = core + F.pad(left, (1, length - 1 - pad)) + F.pad(right, (length - 1 - pad, 1))
    return core


@frames.vjp
def _(ctx: Any, g: ember.Tensor) -> tuple[ember.Tensor, ember.Tensor]:
    # y[t, j] = xp[t*hop + j] w[j] (xp: x padded): gxp is the overlap-add of g * conj(w) (the frames' adjoint), folded
    # back through the padding; gw the sum over the frames of g * conj(frame) (real for a real window), the frames
    # coming from this op with a window of ones (one strided pass on flex, where unfold would gather by index)
    x, window = ctx.inputs
    k = ctx.kwargs
    n_fft, hop = k["n_fft"], k["hop"]
    pad, mode = k.get("pad", 0), k.get("pad_mode", "constant")
    wc = window.conj() if window.dtype.is_complex else window
    lead = tuple(g.shape[:-2])
    gx = overlap_add((g * wc).reshape(-1, g.shape[-2], n_fft), hop=hop)
    length = x.shape[-1]
    padded = length + 2 * pad
    if gx.shape[-1] < padded:  # samples after the last frame get no gradient
        gx = ember.cat([gx, ember.zeros((gx.shape[0], padded - gx.shape[-1]), dtype=gx.dtype, device=gx.device)],
                       dim=-1)
    gx = _unpad_grad(gx, length, pad, mode).reshape(*lead, length)
    if not x.dtype.is_complex and gx.dtype.is_complex:
        gx = ember.real(gx)
    xs = frames(x, ember.ones(n_fft, dtype=x.dtype.to_real, device=x.device), n_fft=n_fft, hop=hop, pad=pad,
                pad_mode=mode)
    gw = (g * (xs.conj() if xs.dtype.is_complex else xs)).reshape(-1, n_fft).sum(0)
    if not window.dtype.is_complex and gw.dtype.is_complex:
        gw = ember.real(gw)
    return gx.to(x.dtype), gw.to(window.dtype)


def _ola_spec(frames: TensorSpec, *, hop: int) -> TensorSpec:
    b, t, n = frames.shape
    return TensorSpec((b, n + hop * (t - 1)), frames.dtype)


@backend_extension("signal.overlap_add", output=_ola_spec, publish=False)
def overlap_add(frames: ember.Tensor, *, hop: int) -> ember.Tensor:
    """Sum frames (B, T, n) placed hop apart: (B, n + hop * (T - 1)) -- the adjoint of framing (``signal.frames``
    with a window of ones), and framing is its vjp.

    The composition (any backend) is r = ceil(n / hop) shifted slices of hop columns each, zero-padded along the frame
    axis and summed; ember-flex's kernel adds the r slices in place into one zeroed output.
    """
    import ember.nn.functional as F

    b, t, n = frames.shape
    r = -(-n // hop)
    if r * hop != n:
        frames = F.pad(frames, (0, r * hop - n))
    parts = frames.reshape(b, t, r, hop)
    total = None
    for i in range(r):
        shifted = F.pad(parts[:, :, i, :], (0, 0, i, r - 1 - i))  # rows i .. i + t - 1 of t + r - 1
        total = shifted if total is None else total + shifted
    assert total is not None
    return total.reshape(b, (t + r - 1) * hop)[:, : n + hop * (t - 1)]


@overlap_add.vjp
def _(ctx: Any, g: ember.Tensor) -> tuple[ember.Tensor]:
    (x,) = ctx.inputs
    n = x.shape[-1]
    return (frames(g, ember.ones(n, dtype=g.dtype.to_real, device=g.device), n_fft=n, hop=ctx.kwargs["hop"]),)


def check_dtype(x: ember.Tensor, op: str) -> ember.Tensor:
    """x ready for a transform: integer and bool inputs in the default float dtype (PyTorch), half types
    refused (PyTorch's CPU FFTs have none), float32/float64/complex as they are."""
    d = x.dtype
    if d.is_complex or d in (dt.float32, dt.float64):
        return x
    if d in (dt.float16, dt.bfloat16):
        raise DTypeError(f"{op}: unsupported dtype {d.name} (the FFTs take float32, float64, complex64 and "
                         "complex128; cast first)")
    return x.to(x.device.default_dtype)
