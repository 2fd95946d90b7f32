"""torchaudio.transforms' ``Spectrogram``, ``MelScale`` and ``MelSpectrogram`` as ember modules, with torchaudio's
defaults: ``n_fft=400``, ``win_length=n_fft``, ``hop_length=win_length // 2``, a periodic Hann window (a buffer),
``power=2.0``, ``center=True`` with reflect padding; ``MelSpectrogram`` adds ``sample_rate=16000``, ``n_mels=128``,
``f_min=0``, ``f_max=sample_rate // 2`` and HTK mel filters without normalization.

>>> import ember
>>> from ember_signal.transforms import MelSpectrogram
>>> mel = MelSpectrogram(sample_rate=16000, n_fft=256, n_mels=32)
>>> mel(ember.randn(2, 4000)).shape
ember.Size([2, 32, 32])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ember
from ember import nn

from .functional import melscale_fbanks, spectrogram
from .windows import hann_window

__all__ = ["Spectrogram", "MelScale", "MelSpectrogram"]


class Spectrogram(nn.Module):
    """A spectrogram of the last dim of its input (``torchaudio.transforms.Spectrogram``): (..., time) ->
    (..., n_fft // 2 + 1, n_frames), ``|stft|^power``."""

    def __init__(self, n_fft: int = 400, win_length: int | None = None, hop_length: int | None = None,
                 pad: int = 0, window_fn: Callable[..., ember.Tensor] = hann_window, power: float | None = 2.0,
                 normalized: bool | str = False, wkwargs: dict[str, Any] | None = None, center: bool = True,
                 pad_mode: str = "reflect", onesided: bool = True, return_complex: bool | None = None) -> None:
        super().__init__()
        self.n_fft = n_fft
        self.win_length = win_length if win_length is not None else n_fft
        self.hop_length = hop_length if hop_length is not None else self.win_length // 2
        window = window_fn(self.win_length) if wkwargs is None else window_fn(self.win_length, **wkwargs)
        self.register_buffer("window", window)
        self.pad = pad
        self.power = power
        self.normalized = normalized
        self.center = center
        self.pad_mode = pad_mode
        self.onesided = onesided
        self.return_complex = return_complex

    def forward(self, waveform: ember.Tensor) -> ember.Tensor:
        """The spectrogram of waveform (..., time)."""
        return spectrogram(waveform, self.pad, self.window, self.n_fft, self.hop_length, self.win_length, self.power,
                           self.normalized, self.center, self.pad_mode, self.onesided, self.return_complex)


class MelScale(nn.Module):
    """Linear-frequency spectrogram (..., n_stft, time) to mel bins (..., n_mels, time)
    (``torchaudio.transforms.MelScale``); the filter bank is the buffer ``fb`` of shape (n_stft, n_mels)."""

    def __init__(self, n_mels: int = 128, sample_rate: int = 16000, f_min: float = 0.0, f_max: float | None = None,
                 n_stft: int = 201, norm: str | None = None, mel_scale: str = "htk") -> None:
        super().__init__()
        self.n_mels = n_mels
        self.sample_rate = sample_rate
        self.f_max = f_max if f_max is not None else float(sample_rate // 2)
        self.f_min = f_min
        self.norm = norm
        self.mel_scale = mel_scale
        if f_min > self.f_max:
            raise ember.ValueRangeError(f"MelScale: require f_min: {f_min} <= f_max: {self.f_max}")
        self.register_buffer("fb", melscale_fbanks(n_stft, self.f_min, self.f_max, n_mels, sample_rate, norm,
                                                   mel_scale))

    def forward(self, specgram: ember.Tensor) -> ember.Tensor:
        """(..., n_stft, time) -> (..., n_mels, time)."""
        return (specgram.transpose(-1, -2) @ self.fb).transpose(-1, -2)


class MelSpectrogram(nn.Module):
    """A mel spectrogram (``torchaudio.transforms.MelSpectrogram``): :class:`Spectrogram` then :class:`MelScale`,
    (..., time) -> (..., n_mels, n_frames)."""

    def __init__(self, sample_rate: int = 16000, n_fft: int = 400, win_length: int | None = None,
                 hop_length: int | None = None, f_min: float = 0.0, f_max: float | None = None, pad: int = 0,
                 n_mels: int = 128, window_fn: Callable[..., ember.Tensor] = hann_window, power: float = 2.0,
                 normalized: bool = False, wkwargs: dict[str, Any] | None = None, center: bool = True,
                 pad_mode: str = "reflect", onesided: bool | None = None, norm: str | None = None,
                 mel_scale: str = "htk") -> None:
        super().__init__()
        self.sample_rate = sample_rate
        self.n_fft = n_fft
        self.win_length = win_length if win_length is not None else n_fft
        self.hop_length = hop_length if hop_length is not None else self.win_length // 2
        self.pad = pad
        self.power = power
        self.normalized = normalized
        self.n_mels = n_mels
        self.f_max = f_max
        self.f_min = f_min
        self.spectrogram = Spectrogram(n_fft=n_fft, win_length=self.win_length, hop_length=self.hop_length, pad=pad,
                                       window_fn=window_fn, power=power, normalized=normalized, wkwargs=wkwargs,
                                       center=center, pad_mode=pad_mode, onesided=True)
        self.mel_scale = MelScale(n_mels, sample_rate, f_min, f_max, n_fft // 2 + 1, norm, mel_scale)

    def forward(self, waveform: ember.Tensor) -> ember.Tensor:
        """The mel spectrogram of waveform (..., time)."""
        return self.mel_scale(self.spectrogram(waveform))
