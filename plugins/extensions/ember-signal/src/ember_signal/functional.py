"""torchaudio.functional's spectrogram and mel filter banks, in ember (torchaudio's formulas; no torchaudio needed).

``melscale_fbanks`` builds triangular filters on the mel scale (``"htk"``: 2595 log10(1 + f / 700); ``"slaney"``:
linear below 1 kHz, logarithmic above), optionally area-normalized (``norm="slaney"``). It is computed on the host
in float64 and returned in the default float dtype (torchaudio computes in float32; values agree to ~1e-6).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import ember
import ember.nn.functional as F
from ember.errors import DTypeError, ValueRangeError

from .spectral import stft

__all__ = ["hz_to_mel", "mel_to_hz", "melscale_fbanks", "spectrogram"]

_MEL_SCALES = ("htk", "slaney")
# slaney: linear up to 1 kHz (200/3 Hz per mel), logarithmic above
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def _check_scale(mel_scale: str, op: str) -> None:
    if mel_scale not in _MEL_SCALES:
        raise ValueRangeError(f"{op}: mel_scale should be one of 'htk' or 'slaney', got {mel_scale!r}")


def hz_to_mel(freq: Any, mel_scale: str = "htk") -> Any:
    """Frequencies in Hz (a number or numpy array) on the mel scale (torchaudio's ``_hz_to_mel``)."""
    _check_scale(mel_scale, "hz_to_mel")
    f = np.asarray(freq, dtype=np.float64)
    if mel_scale == "htk":
        out = 2595.0 * np.log10(1.0 + f / 700.0)
    else:
        with np.errstate(divide="ignore"):
            out = np.where(f >= _MIN_LOG_HZ, _MIN_LOG_MEL + np.log(np.maximum(f, 1e-300) / _MIN_LOG_HZ) / _LOGSTEP,
                           f / _F_SP)
    return float(out) if out.ndim == 0 else out


def mel_to_hz(mels: Any, mel_scale: str = "htk") -> Any:
    """Mel values (a number or numpy array) in Hz (torchaudio's ``_mel_to_hz``)."""
    _check_scale(mel_scale, "mel_to_hz")
    m = np.asarray(mels, dtype=np.float64)
    if mel_scale == "htk":
        out = 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    else:
        out = np.where(m >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL)), _F_SP * m)
    return float(out) if out.ndim == 0 else out


def melscale_fbanks(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int,
                    norm: str | None = None, mel_scale: str = "htk", *, dtype: Any = None,
                    device: Any = None) -> ember.Tensor:
    """Triangular mel filter banks of shape (n_freqs, n_mels) (``torchaudio.functional.melscale_fbanks``):
    ``spectrogram(..., n_freqs, time).transpose(-1, -2) @ fb`` maps linear frequency bins to mel bins."""
    op = "melscale_fbanks"
    for name, v in (("n_freqs", n_freqs), ("n_mels", n_mels)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueRangeError(f"{op}: {name} must be a positive int, got {v!r}")
    if norm is not None and norm != "slaney":
        raise ValueRangeError(f"{op}: norm must be one of None or 'slaney', got {norm!r}")
    _check_scale(mel_scale, op)
    all_freqs = np.linspace(0, sample_rate // 2, n_freqs)
    m_pts = np.linspace(hz_to_mel(f_min, mel_scale), hz_to_mel(f_max, mel_scale), n_mels + 2)
    f_pts = np.asarray(mel_to_hz(m_pts, mel_scale))
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts[None, :] - all_freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    if norm == "slaney":
        fb *= (2.0 / (f_pts[2:n_mels + 2] - f_pts[:n_mels]))[None, :]
    if (fb.max(axis=0) == 0.0).any():
        import warnings

        warnings.warn(f"At least one mel filterbank has all zero values. The value for `n_mels` ({n_mels}) may be "
                      f"set too high. Or, the value for `n_freqs` ({n_freqs}) may be set too low.", stacklevel=2)
    d = ember.get_default_dtype() if dtype is None else ember.dtypes.as_dtype(dtype)
    return ember.tensor(fb, dtype=d, device=device)


def spectrogram(waveform: ember.Tensor, pad: int, window: ember.Tensor, n_fft: int, hop_length: int,
                win_length: int, power: float | None, normalized: bool | str, center: bool = True,
                pad_mode: str = "reflect", onesided: bool = True,
                return_complex: bool | None = None) -> ember.Tensor:
    """Spectrogram of waveform (..., time) as ``torchaudio.functional.spectrogram``: (..., n_freq, n_frames),
    ``|stft|^power`` (complex with power None). ``normalized``: True or ``"window"`` divides by the window's
    L2 norm, ``"frame_length"`` by sqrt(n_fft) (stft's own ``normalized``)."""
    op = "spectrogram"
    if not isinstance(waveform, ember.Tensor):
        raise DTypeError(f"{op}: expected a Tensor waveform, got {type(waveform).__name__}")
    if waveform.ndim < 1:
        raise ValueRangeError(f"{op}: waveform must have a time dim, got a 0-d tensor")
    if pad > 0:
        waveform = F.pad(waveform, (pad, pad), "constant")
    if normalized in (True, "window"):
        frame_norm, window_norm = False, True
    elif normalized == "frame_length":
        frame_norm, window_norm = True, False
    elif normalized in (False, None):
        frame_norm, window_norm = False, False
    else:
        raise ValueRangeError(f"{op}: normalized must be a bool, 'window' or 'frame_length', got {normalized!r}")
    shape = tuple(waveform.shape)
    flat = waveform.reshape(-1, shape[-1])
    spec = stft(flat, n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window, center=center,
                pad_mode=pad_mode, normalized=frame_norm, onesided=onesided, return_complex=True)
    spec = spec.reshape(shape[:-1] + tuple(spec.shape[-2:]))
    if window_norm:
        spec = spec / (window * window).sum().sqrt()
    if power is None:
        return spec
    mag = spec.abs()
    return mag if power == 1.0 else mag.pow(power)
