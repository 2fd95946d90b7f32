"""``ember.stft`` and ``ember.istft``: PyTorch's short-time Fourier transform and its inverse.

Both are written in ember ops around the FFT extension ops of :mod:`ember_signal._ops`, so they run (and are
differentiated) on every device that stores complex numbers: framing and windowing are one op (``signal.frames``:
``Tensor.unfold`` times the window, one strided pass on flex),
the inverse's overlap-add a sum of zero-padded frame slices. Defaults are torch's: ``hop_length = n_fft // 4``,
``win_length = n_fft``, a rectangular window, ``center=True`` with reflect padding of ``n_fft // 2`` each side,
one-sided output for real input, ``normalized`` scaling by ``n_fft ** -0.5``.

>>> import ember
>>> x = ember.arange(16.0)
>>> spec = ember.stft(x, n_fft=8, window=ember.hann_window(8), return_complex=True)
>>> spec.shape
ember.Size([5, 9])
>>> ember.istft(spec, n_fft=8, window=ember.hann_window(8), length=16).sub(x).abs().max().item() < 1e-4
True
"""

from __future__ import annotations

from typing import Any

import ember
import ember.nn.functional as F
from ember.errors import DTypeError, ShapeError, ValueRangeError

from . import fft as _fft  # noqa: F401 - registers the transforms' ops and flex kernels
from ._ops import FRAME_PADS, c2c, c2r, check_dtype, frames, overlap_add, r2c

__all__ = ["stft", "istft"]

_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _positive(v: Any, name: str, op: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueRangeError(f"{op}: expected {name} to be a positive int, got {v!r}")
    return v


def _window(window: ember.Tensor | None, n_fft: int, win_length: int, like: ember.Tensor,
            op: str) -> ember.Tensor | None:
    """The window zero-padded (centred) to n_fft, or None for the rectangular window of n_fft ones."""
    if window is None:
        if win_length == n_fft:
            return None
        w = ember.ones(win_length, dtype=like.dtype.to_real, device=like.device)
    else:
        if not isinstance(window, ember.Tensor):
            raise DTypeError(f"{op}: window must be a Tensor or None, got {type(window).__name__}")
        if window.ndim != 1 or window.shape[0] != win_length:
            raise ShapeError(f"{op}: expected a 1D window tensor of size equal to win_length={win_length}, but got "
                             f"window with size {tuple(window.shape)}")
        if window.device != like.device:
            raise ember.DeviceError(f"{op}: window is on {window.device}, the input on {like.device}")
        w = window
    if win_length < n_fft:
        left = (n_fft - win_length) // 2
        w = F.pad(w, (left, n_fft - win_length - left))
    return w


def _lengths(n_fft: Any, hop_length: Any, win_length: Any, op: str) -> tuple[int, int, int]:
    n_fft = _positive(n_fft, "n_fft", op)
    win = n_fft if win_length is None else _positive(win_length, "win_length", op)
    hop = n_fft // 4 if hop_length is None else _positive(hop_length, "hop_length", op)
    if hop_length is None and hop == 0:
        raise ValueRangeError(f"{op}: n_fft={n_fft} gives the default hop_length n_fft // 4 = 0; give hop_length")
    if win > n_fft:
        raise ValueRangeError(f"{op}: expected 0 < win_length <= n_fft, but got win_length={win}, n_fft={n_fft}")
    return n_fft, hop, win


def stft(input: ember.Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
         window: ember.Tensor | None = None, center: bool = True, pad_mode: str = "reflect",
         normalized: bool = False, onesided: bool | None = None,
         return_complex: bool | None = None) -> ember.Tensor:
    """Short-time Fourier transform (``torch.stft``): input (L) or (B, L) to (B?, n_freq, n_frames) complex
    (n_freq = n_fft // 2 + 1 when onesided), or with ``return_complex=False`` a real (..., 2) tensor."""
    op = "stft"
    if not isinstance(input, ember.Tensor):
        raise DTypeError(f"{op}: expected a Tensor as input, got {type(input).__name__}")
    x = check_dtype(input, op)
    if x.ndim not in (1, 2):
        raise ShapeError(f"{op}: expected a 1D or 2D tensor, got shape {tuple(x.shape)}")
    complex_in = x.dtype.is_complex or (window is not None and window.dtype.is_complex)
    if return_complex is None:
        if not complex_in:
            raise ValueRangeError(f"{op}: stft requires the return_complex parameter be given for real inputs, and "
                                  "will further require that return_complex=True in a future PyTorch release")
        return_complex = True
    n_fft, hop, win = _lengths(n_fft, hop_length, win_length, op)
    batched = x.ndim == 2
    if not batched:
        x = x.unsqueeze(0)
    pad = 0
    if center:
        if pad_mode not in _PAD_MODES:
            raise ValueRangeError(f"{op}: pad_mode must be one of {_PAD_MODES}, got {pad_mode!r}")
        p = n_fft // 2
        if pad_mode in FRAME_PADS and (pad_mode == "constant" or 0 < p < x.shape[-1]):
            pad = p  # padded by the framing op itself (flex: one concatenation)
        else:  # F.pad checks the other modes (and reflect padding as long as the signal)
            x = F.pad(x.unsqueeze(0), (p, p), mode=pad_mode).squeeze(0)
    length = x.shape[-1] + 2 * pad
    if not 0 < n_fft <= length:
        raise ValueRangeError(f"{op}: expected 0 < n_fft <= {length} (the padded input length), but got "
                              f"n_fft={n_fft}")
    w = _window(window, n_fft, win, x, op)
    if w is None:
        w = ember.ones(n_fft, dtype=x.dtype.to_real, device=x.device)
    # (B, n_frames, n_fft): padding, framing and windowing in one op (one pass on flex), then one batched FFT
    framed = frames(x, w, n_fft=n_fft, hop=hop, pad=pad, pad_mode=pad_mode if pad else "constant")
    if onesided is None:
        onesided = not framed.dtype.is_complex
    if onesided and framed.dtype.is_complex:
        raise ValueRangeError(f"{op}: cannot have onesided output if window or input is complex")
    norm = "ortho" if normalized else "backward"
    if onesided:
        spec = r2c(framed, s=(n_fft,), dims=(2,), norm=norm)
    else:
        spec = c2c(framed, s=(n_fft,), dims=(2,), norm=norm, forward=True)
    spec = spec.transpose(1, 2)
    if not batched:
        spec = spec.squeeze(0)
    return spec if return_complex else ember.view_as_real(spec)


def istft(input: ember.Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
          window: ember.Tensor | None = None, center: bool = True, normalized: bool = False,
          onesided: bool | None = None, length: int | None = None, return_complex: bool = False) -> ember.Tensor:
    """Inverse short-time Fourier transform (``torch.istft``): a complex (B?, n_freq, n_frames) spectrum back to
    (B?, L) by inverse FFTs, windowing, overlap-add and division by the summed squared window."""
    op = "istft"
    if not isinstance(input, ember.Tensor):
        raise DTypeError(f"{op}: expected a Tensor as input, got {type(input).__name__}")
    if not input.dtype.is_complex:
        raise DTypeError(f"{op}: requires a complex-valued input tensor, got {input.dtype.name} (use "
                         "ember.view_as_complex on a real (..., 2) tensor)")
    if input.ndim not in (2, 3):
        raise ShapeError(f"{op}: expected a 2D or 3D complex tensor (B?, n_freq, n_frames), got shape "
                         f"{tuple(input.shape)}")
    n_fft, hop, win = _lengths(n_fft, hop_length, win_length, op)
    batched = input.ndim == 3
    x = input if batched else input.unsqueeze(0)
    fft_size, n_frames = x.shape[1], x.shape[2]
    if onesided is None:
        onesided = fft_size != n_fft
    if onesided and fft_size != n_fft // 2 + 1:
        raise ShapeError(f"{op}: expected the frequency dimension (dim -2) of input to be n_fft // 2 + 1 = "
                         f"{n_fft // 2 + 1} for a one-sided spectrum, got {fft_size}")
    if not onesided and fft_size != n_fft:
        raise ShapeError(f"{op}: expected the frequency dimension (dim -2) of input to be n_fft = {n_fft} for a "
                         f"two-sided spectrum, got {fft_size}")
    if return_complex and onesided:
        raise ValueRangeError(f"{op}: cannot have onesided output if window or input is complex")
    norm = "ortho" if normalized else "backward"
    spec = x.transpose(1, 2)  # (B, T, F)
    if return_complex:
        frames = c2c(spec, s=(n_fft,), dims=(2,), norm=norm, forward=False)
    else:
        if not onesided:
            spec = spec.narrow(2, 0, n_fft // 2 + 1)
        frames = c2r(spec, s=(n_fft,), dims=(2,), norm=norm)
    w = _window(window, n_fft, win, frames, op)
    if w is None:
        w = ember.ones(n_fft, dtype=frames.dtype.to_real, device=frames.device)
    frames = frames * w
    y = overlap_add(frames, hop=hop)
    envelope = overlap_add((w * w).reshape(1, 1, n_fft).expand(1, n_frames, n_fft), hop=hop)
    expected = n_fft + hop * (n_frames - 1)
    start = n_fft // 2 if center else 0
    if length is not None:
        end = start + length
    elif center:
        end = expected - n_fft // 2
    else:
        end = expected
    stop = min(end, expected)
    y = y[:, start:stop]
    envelope = envelope[:, start:stop]
    if envelope.numel() and envelope.abs().min().item() < 1e-11:
        raise ValueRangeError(f"{op}: window overlap add min: the squared window summed over the frames is below "
                              "1e-11 somewhere (the window and hop_length do not satisfy NOLA); change them")
    y = y / envelope
    if end > expected:
        y = F.pad(y, (0, end - expected))
    return y if batched else y.squeeze(0)


