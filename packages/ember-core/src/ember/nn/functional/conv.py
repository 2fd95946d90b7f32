"""Convolution, pooling, interpolation, padding and unfold/fold (``torch.nn.functional`` names and defaults).

Arguments are normalised here (ints to per-dim tuples, 'same' padding to (lo, hi) pairs) and every shape rule
is checked before one call to the backend's ``conv`` / ``max_pool`` / ``interpolate`` / ``pad`` ... .
"""

from __future__ import annotations

import math
from typing import Any

from ...amp.autocast_mode import STATE as _AMP
from ...amp.autocast_mode import run as _amp_run
from ...errors import DTypeError, ShapeError, UnsupportedError, ValueRangeError
from ...ops import nn as _nn
from ...tensor import Tensor
from ._util import check_float, check_like, check_tensor, int_tuple, is_int, prod

_LAYOUT = {
    1: ("(N, C, L)", "(C, L)", "kL"),
    2: ("(N, C, H, W)", "(C, H, W)", "kH, kW"),
    3: ("(N, C, D, H, W)", "(C, D, H, W)", "kD, kH, kW"),
}


def _check_rank(op: str, x: Tensor, nd: int, batched_only: bool = False) -> bool:
    """True when x is unbatched (C, *spatial); raises ShapeError for any other rank."""
    if x.ndim == nd + 2:
        return False
    if x.ndim == nd + 1 and not batched_only:
        return True
    full, unb, _ = _LAYOUT[nd]
    alt = "" if batched_only else f" or {nd + 1} {unb}"
    raise ShapeError(f"{op}: expected input with {nd + 2} dims {full}{alt}, got shape {x.shape}")


# ----------------------------------------------------------------------------------------------------------
# convolution
# ----------------------------------------------------------------------------------------------------------
def _conv_common(op: str, nd: int, input: Tensor, weight: Tensor) -> bool:
    check_float(input, op)
    check_like(input, weight, op, "weight")
    unbatched = _check_rank(op, input, nd)
    if weight.ndim != nd + 2:
        raise ShapeError(f"{op}: expected weight with {nd + 2} dims (C_out, C_in/groups, {_LAYOUT[nd][2]}), "
                         f"got shape {weight.shape}")
    return unbatched


def _check_groups(op: str, groups: Any) -> int:
    if not is_int(groups) or groups < 1:
        raise ValueRangeError(f"{op}: groups must be a positive int, got {groups!r}")
    return int(groups)


def _convnd(op: str, nd: int, input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any,
            dilation: Any, groups: Any) -> Tensor:
    unbatched = _conv_common(op, nd, input, weight)
    g = _check_groups(op, groups)
    st = int_tuple(stride, nd, op, "stride", 1)
    dl = int_tuple(dilation, nd, op, "dilation", 1)
    ks = weight.shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0),) * nd
        elif padding == "same":
            if any(v != 1 for v in st):
                raise ValueRangeError(f"{op}: padding='same' is not supported for strided convolutions "
                                      f"(stride {st})")
            # torch puts the odd extra element at the end
            pads = tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dl, ks))
        else:
            raise ValueRangeError(f"{op}: padding must be 'valid', 'same', an int or a tuple of ints, "
                                  f"got {padding!r}")
    else:
        pads = tuple((p, p) for p in int_tuple(padding, nd, op, "padding", 0))
    xs = ((1,) + input.shape) if unbatched else input.shape
    n, cin, sp = xs[0], xs[1], xs[2:]
    cout = weight.shape[0]
    if cout == 0:
        raise ShapeError(f"{op}: expected weight to be at least 1 at dimension 0 (out_channels), got weight of "
                         f"shape {weight.shape}")
    if cout % g:
        raise ShapeError(f"{op}: out_channels {cout} (weight shape {weight.shape}) is not divisible by groups={g}")
    if n and cin and 0 in sp:
        raise ShapeError(f"{op}: only zero batch or zero channel inputs are supported, got input shape "
                         f"{input.shape} (an empty spatial dimension)")
    if cin != weight.shape[1] * g:
        raise ShapeError(f"{op}: input has {cin} channels but weight expects {weight.shape[1] * g} "
                         f"(weight shape {weight.shape}, groups={g})")
    if bias is not None:
        check_like(input, bias, op, "bias", (cout,))
    padded = tuple(L + lo + hi for L, (lo, hi) in zip(sp, pads))
    eff = tuple(d * (k - 1) + 1 for d, k in zip(dl, ks))
    if any(e > p for e, p in zip(eff, padded)):
        raise ShapeError(f"{op}: kernel size {tuple(ks)} (dilated to {eff}) is larger than the padded input "
                         f"size {padded} (input shape {input.shape}, padding {pads})")
    out = tuple((p - e) // s + 1 for p, e, s in zip(padded, eff, st))
    return _nn.conv(input, weight, bias, st, pads, dl, g, unbatched, out)


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """1-d cross-correlation: input (N, C_in, L) or (C_in, L), weight (C_out, C_in/groups, kL)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("conv1d", conv1d, input, weight, bias, stride, padding, dilation, groups)
    return _convnd("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """2-d cross-correlation: input (N, C_in, H, W) or (C_in, H, W), weight (C_out, C_in/groups, kH, kW)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("conv2d", conv2d, input, weight, bias, stride, padding, dilation, groups)
    return _convnd("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """3-d cross-correlation: input (N, C_in, D, H, W) or unbatched, weight (C_out, C_in/groups, kD, kH, kW)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("conv3d", conv3d, input, weight, bias, stride, padding, dilation, groups)
    return _convnd("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


def _conv_transposend(op: str, nd: int, input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any,
                      padding: Any, output_padding: Any, groups: Any, dilation: Any) -> Tensor:
    check_float(input, op)
    check_like(input, weight, op, "weight")
    unbatched = _check_rank(op, input, nd)
    if weight.ndim != nd + 2:
        raise ShapeError(f"{op}: expected weight with {nd + 2} dims (C_in, C_out/groups, {_LAYOUT[nd][2]}), "
                         f"got shape {weight.shape}")
    g = _check_groups(op, groups)
    st = int_tuple(stride, nd, op, "stride", 1)
    dl = int_tuple(dilation, nd, op, "dilation", 1)
    if isinstance(padding, str):
        raise ValueRangeError(f"{op}: string padding {padding!r} is not supported for transposed convolutions")
    pd = int_tuple(padding, nd, op, "padding", 0)
    op_ = int_tuple(output_padding, nd, op, "output_padding", 0)
    for o, s_, d in zip(op_, st, dl):
        if o >= s_ and o >= d:
            raise ValueRangeError(f"{op}: output padding must be smaller than either stride or dilation, got "
                                  f"output_padding {op_}, stride {st}, dilation {dl}")
    xs = ((1,) + input.shape) if unbatched else input.shape
    n, cin, sp = xs[0], xs[1], xs[2:]
    if cin != weight.shape[0]:
        raise ShapeError(f"{op}: input has {cin} channels but weight expects {weight.shape[0]} "
                         f"(weight shape {weight.shape}, groups={g})")
    if cin % g:
        raise ShapeError(f"{op}: in_channels {cin} is not divisible by groups={g}")
    if weight.numel() == 0:
        raise ShapeError(f"{op}: non-empty weight expected, got weight of shape {weight.shape}")
    if n and cin and 0 in sp:
        raise ShapeError(f"{op}: only zero batch or zero channel inputs are supported, got input shape "
                         f"{input.shape} (an empty spatial dimension)")
    cout = weight.shape[1] * g
    if bias is not None:
        check_like(input, bias, op, "bias", (cout,))
    ks = weight.shape[2:]
    out = tuple((L - 1) * s_ - 2 * p + d * (k - 1) + o + 1 for L, s_, p, d, k, o in zip(sp, st, pd, dl, ks, op_))
    if any(o <= 0 for o in out):
        raise ShapeError(f"{op}: computed output size {out} is not positive (input shape {input.shape}, weight "
                         f"shape {weight.shape}, stride {st}, padding {pd}, dilation {dl})")
    return _nn.conv_transpose(input, weight, bias, st, pd, op_, dl, g, unbatched, out)


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,
                     padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """1-d transposed convolution; weight (C_in, C_out/groups, kL). Note torch's order: groups before dilation."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("conv_transpose1d", conv_transpose1d, input, weight, bias, stride, padding, output_padding,
                        groups, dilation)
    return _conv_transposend("conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups,
                             dilation)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,
                     padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """2-d transposed convolution; weight (C_in, C_out/groups, kH, kW)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("conv_transpose2d", conv_transpose2d, input, weight, bias, stride, padding, output_padding,
                        groups, dilation)
    return _conv_transposend("conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups,
                             dilation)


def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,
                     padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """3-d transposed convolution; weight (C_in, C_out/groups, kD, kH, kW)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("conv_transpose3d", conv_transpose3d, input, weight, bias, stride, padding, output_padding,
                        groups, dilation)
    return _conv_transposend("conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups,
                             dilation)


# ----------------------------------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------------------------------
def _pool_out(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = n + 2 * p - d * (k - 1) - 1
    if ceil_mode:
        o = -(-num // s) + 1
        if (o - 1) * s >= n + p:  # the last window must start inside the input or left padding
            o -= 1
        return o
    return num // s + 1


def _pool_args(op: str, nd: int, input: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
               ceil_mode: bool) -> tuple[tuple[int, ...], ...]:
    check_tensor(input, op)
    if input._dtype.is_bool:
        raise DTypeError(f"{op}: not implemented for bool tensors")
    unbatched = _check_rank(op, input, nd)
    body = input.shape if unbatched else input.shape[1:]
    if 0 in body:  # PyTorch pools only a zero batch: channels and spatial sizes must be non-zero
        raise ShapeError(f"{op}: expected input with non-zero sizes for the non-batch dimensions (an empty batch "
                         f"is fine), got shape {input.shape}")
    ks = int_tuple(kernel_size, nd, op, "kernel_size", 1)
    st = ks if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else \
        int_tuple(stride, nd, op, "stride", 1)
    pd = int_tuple(padding, nd, op, "padding", 0)
    dl = int_tuple(dilation, nd, op, "dilation", 1)
    for p, k, d in zip(pd, ks, dl):
        if p > ((k - 1) * d + 1) // 2:
            raise ValueRangeError(f"{op}: pad should be at most half of effective kernel size, but got "
                                  f"padding {pd}, kernel_size {ks} and dilation {dl}")
    sp = input.shape[-nd:]
    out = tuple(_pool_out(n, k, s, p, d, ceil_mode) for n, k, s, p, d in zip(sp, ks, st, pd, dl))
    if any(o <= 0 for o in out):
        raise ShapeError(f"{op}: output size {out} is too small for input shape {input.shape} "
                         f"(kernel_size {ks}, stride {st}, padding {pd}, dilation {dl})")
    return ks, st, pd, dl, out


def _max_poolnd(op: str, nd: int, input: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                ceil_mode: bool, return_indices: bool) -> Any:
    ks, st, pd, dl, out = _pool_args(op, nd, input, kernel_size, stride, padding, dilation, ceil_mode)
    return _nn.max_pool(input, nd, ks, st, pd, dl, ceil_mode, return_indices, out)


def max_pool1d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """1-d max pooling over (N, C, L) or (C, L); stride defaults to kernel_size."""
    return _max_poolnd("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """2-d max pooling over (N, C, H, W) or (C, H, W)."""
    return _max_poolnd("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """3-d max pooling over (N, C, D, H, W) or (C, D, H, W)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("max_pool3d", max_pool3d, input, kernel_size, stride, padding, dilation, ceil_mode,
                        return_indices)
    return _max_poolnd("max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _avg_poolnd(op: str, nd: int, input: Tensor, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                count_include_pad: bool, divisor_override: Any) -> Tensor:
    ks, st, pd, _, out = _pool_args(op, nd, input, kernel_size, stride, padding, 1, ceil_mode)
    if divisor_override is not None and (not is_int(divisor_override) or divisor_override == 0):
        raise ValueRangeError(f"{op}: divisor_override must be a non-zero int, got {divisor_override!r}")
    return _nn.avg_pool(input, nd, ks, st, pd, ceil_mode, count_include_pad, divisor_override, out)


def avg_pool1d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """1-d average pooling over (N, C, L) or (C, L)."""
    return _avg_poolnd("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """2-d average pooling over (N, C, H, W) or (C, H, W)."""
    return _avg_poolnd("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override)


def avg_pool3d(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """3-d average pooling over (N, C, D, H, W) or (C, D, H, W)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("avg_pool3d", avg_pool3d, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override)
    return _avg_poolnd("avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override)


def _adaptive_size(op: str, nd: int, input: Tensor, output_size: Any) -> tuple[int, ...]:
    unbatched = _check_rank(op, input, nd)
    sp = input.shape[-nd:]
    # PyTorch refuses zero channels in adaptive max pools and 3-d adaptive average pools (spatial: checked below)
    if (op.startswith("adaptive_max") or nd == 3) and 0 in (input.shape if unbatched else input.shape[1:2]):
        raise ShapeError(f"{op}: expected input with non-zero sizes for the non-batch dimensions, got shape "
                         f"{input.shape}")
    if output_size is None or is_int(output_size):
        raw: tuple[Any, ...] = (output_size,) * nd
    elif isinstance(output_size, (tuple, list)):
        raw = tuple(output_size)
        if len(raw) == 1 and nd > 1:
            raw = raw * nd
    else:
        raw = ()
    if len(raw) != nd or not all(v is None or is_int(v) for v in raw):
        raise ValueRangeError(f"{op}: output_size must be an int or a sequence of {nd} ints or None, "
                              f"got {output_size!r}")
    out = tuple(n if v is None else int(v) for v, n in zip(raw, sp))
    if any(o < 0 for o in out):
        raise ValueRangeError(f"{op}: output_size must be non-negative, got {out}")
    if any(n == 0 for n in sp):
        raise ShapeError(f"{op}: expected input with non-zero sizes for the non-batch dimensions, got shape "
                         f"{input.shape}")
    return out


def _adaptive_avg(op: str, nd: int, input: Tensor, output_size: Any) -> Tensor:
    check_float(input, op)
    return _nn.adaptive_avg_pool(input, nd, _adaptive_size(op, nd, input, output_size))


def _adaptive_max(op: str, nd: int, input: Tensor, output_size: Any, return_indices: bool) -> Any:
    check_float(input, op)
    return _nn.adaptive_max_pool(input, nd, _adaptive_size(op, nd, input, output_size), return_indices)


def adaptive_avg_pool1d(input: Tensor, output_size: Any) -> Tensor:
    """Average pooling to a fixed output length."""
    return _adaptive_avg("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """Average pooling to a fixed (H, W); None entries keep the input size."""
    return _adaptive_avg("adaptive_avg_pool2d", 2, input, output_size)


def adaptive_avg_pool3d(input: Tensor, output_size: Any) -> Tensor:
    """Average pooling to a fixed (D, H, W); None entries keep the input size."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("adaptive_avg_pool3d", adaptive_avg_pool3d, input, output_size)
    return _adaptive_avg("adaptive_avg_pool3d", 3, input, output_size)


def adaptive_max_pool1d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """Max pooling to a fixed output length."""
    return _adaptive_max("adaptive_max_pool1d", 1, input, output_size, return_indices)


def adaptive_max_pool2d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """Max pooling to a fixed (H, W); None entries keep the input size."""
    return _adaptive_max("adaptive_max_pool2d", 2, input, output_size, return_indices)


def adaptive_max_pool3d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """Max pooling to a fixed (D, H, W); None entries keep the input size."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("adaptive_max_pool3d", adaptive_max_pool3d, input, output_size, return_indices)
    return _adaptive_max("adaptive_max_pool3d", 3, input, output_size, return_indices)


# ----------------------------------------------------------------------------------------------------------
# interpolate
# ----------------------------------------------------------------------------------------------------------
_MODE_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")


def interpolate(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """Resize the spatial dims of ``(N, C, *spatial)`` input to size, or by scale_factor."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("interpolate", interpolate, input, size, scale_factor, mode, align_corners,
                        recompute_scale_factor, antialias)
    op = "interpolate"
    check_tensor(input, op)
    if mode not in _MODES:
        raise ValueRangeError(f"{op}: mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if input.ndim not in (3, 4, 5):
        raise ShapeError(f"{op}: expected a 3-D, 4-D or 5-D input (N, C, *spatial), got shape {input.shape}")
    nd = input.ndim - 2
    if mode in _MODE_DIMS and _MODE_DIMS[mode] != nd:
        raise ShapeError(f"{op}: got {input.ndim}D input, but {mode} mode needs {_MODE_DIMS[mode] + 2}D input "
                         f"(shape {input.shape})")
    if align_corners is not None and mode not in _MODE_DIMS:
        raise ValueRangeError(f"{op}: align_corners option can only be set with the interpolating modes: "
                              f"linear | bilinear | bicubic | trilinear (got mode {mode!r})")
    if antialias:
        raise UnsupportedError(f"{op}: antialias=True is not supported")
    if mode not in ("nearest", "nearest-exact"):
        check_float(input, op)
    elif input._dtype.is_bool:
        raise DTypeError(f"{op}: not implemented for bool tensors")
    sp = input.shape[2:]
    scales: tuple[float, ...] | None = None
    if size is not None and scale_factor is not None:
        raise ValueRangeError(f"{op}: only one of size or scale_factor should be defined")
    if size is not None:
        if is_int(size):
            out = (int(size),) * nd
        elif isinstance(size, (tuple, list)) and all(is_int(v) for v in size) and len(size) == nd:
            out = tuple(int(v) for v in size)
        else:
            raise ValueRangeError(f"{op}: size must be an int or a sequence of {nd} ints for input shape "
                                  f"{input.shape}, got {size!r}")
    elif scale_factor is not None:
        if isinstance(scale_factor, (tuple, list)):
            sf = tuple(float(v) for v in scale_factor)
            if len(sf) != nd:
                raise ValueRangeError(f"{op}: scale_factor must have {nd} elements for input shape "
                                      f"{input.shape}, got {tuple(scale_factor)}")
        elif isinstance(scale_factor, (int, float)) and not isinstance(scale_factor, bool):
            sf = (float(scale_factor),) * nd
        else:
            raise ValueRangeError(f"{op}: scale_factor must be a number or a sequence of numbers, "
                                  f"got {scale_factor!r}")
        if any(not v > 0 for v in sf):
            raise ValueRangeError(f"{op}: scale_factor must be positive, got {sf}")
        out = tuple(int(math.floor(float(n) * f)) for n, f in zip(sp, sf))
        if not recompute_scale_factor:
            scales = sf  # torch hands the user's scales to the kernel unless asked to recompute
    else:
        raise ValueRangeError(f"{op}: either size or scale_factor should be defined")
    if any(o <= 0 for o in out) or any(n <= 0 for n in sp):
        raise ShapeError(f"{op}: input and output sizes should be greater than 0, but got input {sp} and "
                         f"output {out}")
    return _nn.interpolate(input, out, mode, align_corners, scales)


def upsample(input: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
             align_corners: bool | None = None) -> Tensor:
    """Deprecated alias of :func:`interpolate`."""
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:
    """Bilinear upsampling with align_corners=True (as torch's deprecated helper)."""
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


# ----------------------------------------------------------------------------------------------------------
# pad
# ----------------------------------------------------------------------------------------------------------
_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(input: Tensor, pad: Any, mode: str = "constant", value: float | None = None) -> Tensor:
    """Pad the last len(pad)//2 dims; pad lists (left, right) pairs starting from the last dim."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run(_pad_key(pad, mode), _PAD, input, pad, mode, value)
    op = "pad"
    check_tensor(input, op)
    if not isinstance(pad, (tuple, list)) or not all(is_int(v) for v in pad):
        raise ValueRangeError(f"{op}: pad must be a sequence of ints, got {pad!r}")
    if len(pad) % 2:
        raise ValueRangeError(f"{op}: padding length must be divisible by 2, got {len(pad)} ({tuple(pad)})")
    npairs = len(pad) // 2
    if npairs > input.ndim:
        raise ShapeError(f"{op}: padding length {len(pad)} is too large for input shape {input.shape} "
                         f"(at most {2 * input.ndim})")
    if mode not in _PAD_MODES:
        raise ValueRangeError(f"{op}: mode must be one of {', '.join(_PAD_MODES)}, got {mode!r}")
    if mode != "constant" and value is not None and value != 0:
        raise ValueRangeError(f"{op}: padding mode {mode!r} doesn't take in value argument")
    n = input.ndim
    pairs = [(0, 0)] * n
    for i in range(npairs):
        pairs[n - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    shape = input.shape
    if mode != "constant":
        if npairs < 1 or npairs > 3 or n not in (npairs + 1, npairs + 2):
            raise ShapeError(f"{op}: {mode} padding of the last {npairs} dims expects a {npairs + 1}-D or "
                             f"{npairs + 2}-D input, got shape {shape}")
        for d in range(n - npairs, n):
            lo, hi = pairs[d]
            size = shape[d]
            if mode == "reflect" and (lo >= size or hi >= size):
                raise ValueRangeError(f"{op}: padding size should be less than the corresponding input dimension, "
                                      f"but got padding ({lo}, {hi}) at dimension {d} of input shape {shape}")
            if mode == "circular" and (lo > size or hi > size):
                raise ValueRangeError(f"{op}: padding value causes wrapping around more than once "
                                      f"(padding ({lo}, {hi}) at dimension {d} of input shape {shape})")
            if mode == "replicate" and size == 0 and (lo > 0 or hi > 0):
                raise ShapeError(f"{op}: cannot replicate-pad the empty dimension {d} of input shape {shape}")
    for d, ((lo, hi), size) in enumerate(zip(pairs, shape)):
        if size + min(lo, 0) + min(hi, 0) < 0:  # PyTorch crops first: narrow() to a negative length
            raise ShapeError(f"{op}: negative padding ({lo}, {hi}) crops dimension {d} of size {size} to a negative "
                             f"output size {size + min(lo, 0) + min(hi, 0)} (input shape {shape}, pad {tuple(pad)})")
    out = tuple(size + lo + hi for size, (lo, hi) in zip(shape, pairs))
    if any(o < 0 for o in out):
        raise ShapeError(f"{op}: the input size {shape} with padding {tuple(pad)} would give negative output "
                         f"size {out}")
    return _nn.pad(input, tuple(pairs), mode, 0 if value is None else value, out)


# the function itself: inside pad() its parameter ``pad`` hides the name
_PAD = pad


def _pad_key(pad: Any, mode: Any) -> str:
    """pad's name in the autocast tables: PyTorch lists reflection_pad1d/2d and replication_pad1d/2d/3d as float32
    ops, per mode and padded rank."""
    return f"pad_{mode}_{len(pad) // 2}d" if isinstance(pad, (tuple, list)) else "pad"


# ----------------------------------------------------------------------------------------------------------
# unfold / fold (im2col / col2im) and pixel shuffle
# ----------------------------------------------------------------------------------------------------------
def _fold_args(op: str, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> tuple[tuple[int, ...], ...]:
    return (int_tuple(kernel_size, 2, op, "kernel_size", 1), int_tuple(dilation, 2, op, "dilation", 1),
            int_tuple(padding, 2, op, "padding", 0), int_tuple(stride, 2, op, "stride", 1))


def unfold(input: Tensor, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> Tensor:
    """Sliding blocks of (N, C, H, W) as columns (N, C * kH * kW, L); (C, H, W) gives (C * kH * kW, L)."""
    op = "unfold"
    check_tensor(input, op)
    unbatched = _check_rank(op, input, 2)
    ks, dl, pd, st = _fold_args(op, kernel_size, dilation, padding, stride)
    H, W = input.shape[-2:]
    out = tuple((L + 2 * p - d * (k - 1) - 1) // s_ + 1 for L, p, d, k, s_ in zip((H, W), pd, dl, ks, st))
    if any(o <= 0 for o in out):
        raise ShapeError(f"{op}: the sliding blocks do not fit: input shape {input.shape}, kernel_size {ks}, "
                         f"dilation {dl}, padding {pd}, stride {st} give block grid {out}")
    return _nn.unfold(input, unbatched, ks, dl, pd, st, out)


def fold(input: Tensor, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0,
         stride: Any = 1) -> Tensor:
    """Sum columns (N, C * kH * kW, L) back into (N, C, H, W) (the inverse layout of unfold)."""
    op = "fold"
    check_tensor(input, op)
    if input.ndim not in (2, 3):
        raise ShapeError(f"{op}: expected input with 3 dims (N, C * kH * kW, L) or 2 (C * kH * kW, L), got shape "
                         f"{input.shape}")
    unbatched = input.ndim == 2
    osz = int_tuple(output_size, 2, op, "output_size", 1)
    ks, dl, pd, st = _fold_args(op, kernel_size, dilation, padding, stride)
    ck, L = input.shape[-2:]
    K = prod(ks)
    if ck % K:
        raise ShapeError(f"{op}: expected size of input's dimension 1 ({ck}) to be divisible by the product of "
                         f"kernel_size {ks} ({K}), input shape {input.shape}")
    out = tuple((S + 2 * p - d * (k - 1) - 1) // s_ + 1 for S, p, d, k, s_ in zip(osz, pd, dl, ks, st))
    if any(o <= 0 for o in out) or prod(out) != L:
        raise ShapeError(f"{op}: given output_size {osz}, kernel_size {ks}, dilation {dl}, padding {pd}, stride "
                         f"{st}, expected size of input's dimension 2 to be {max(prod(out), 0)}, but got {L} "
                         f"(input shape {input.shape})")
    return _nn.fold(input, unbatched, osz, ks, dl, pd, st, out)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(*, C * r * r, H, W) -> (*, C, H * r, W * r)."""
    op = "pixel_shuffle"
    check_tensor(input, op)
    r = upscale_factor
    if not is_int(r) or r < 1:
        raise ValueRangeError(f"{op}: upscale_factor must be a positive int, got {r!r}")
    if input.ndim < 3:
        raise ShapeError(f"{op}: expected an input with at least 3 dims (*, C * r^2, H, W), got shape "
                         f"{input.shape}")
    *lead, c, H, W = input.shape
    if c % (r * r):
        raise ShapeError(f"{op}: channels {c} of input shape {input.shape} are not divisible by "
                         f"upscale_factor^2 = {r * r}")
    return _nn.pixel_shuffle(input, r, inverse=False)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """(*, C, H * r, W * r) -> (*, C * r * r, H, W)."""
    op = "pixel_unshuffle"
    check_tensor(input, op)
    r = downscale_factor
    if not is_int(r) or r < 1:
        raise ValueRangeError(f"{op}: downscale_factor must be a positive int, got {r!r}")
    if input.ndim < 3:
        raise ShapeError(f"{op}: expected an input with at least 3 dims (*, C, H * r, W * r), got shape "
                         f"{input.shape}")
    *lead, c, H, W = input.shape
    if H % r or W % r:
        raise ShapeError(f"{op}: height {H} and width {W} of input shape {input.shape} must be divisible by "
                         f"downscale_factor {r}")
    return _nn.pixel_shuffle(input, r, inverse=True)


__all__ = [
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "pad", "unfold", "fold",
    "pixel_shuffle", "pixel_unshuffle",
]
