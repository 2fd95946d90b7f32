"""``ember.signal``: window functions (``ember.signal.windows``, as ``torch.signal.windows``), torchaudio's mel
filter banks (``melscale_fbanks``, ``hz_to_mel``, ``mel_to_hz``), the functional ``spectrogram`` and the
``Spectrogram``, ``MelScale`` and ``MelSpectrogram`` modules (``torchaudio.transforms``' defaults and formulas).

>>> import ember
>>> fb = ember.signal.melscale_fbanks(n_freqs=201, f_min=0.0, f_max=8000.0, n_mels=40, sample_rate=16000)
>>> fb.shape
ember.Size([201, 40])
"""

from __future__ import annotations

from . import windows
from .functional import hz_to_mel, mel_to_hz, melscale_fbanks, spectrogram
from .transforms import MelScale, MelSpectrogram, Spectrogram

__all__ = ["windows", "melscale_fbanks", "hz_to_mel", "mel_to_hz", "spectrogram", "Spectrogram",
           "MelScale", "MelSpectrogram"]
