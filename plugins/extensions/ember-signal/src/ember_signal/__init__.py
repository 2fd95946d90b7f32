"""ember-signal: PyTorch's ``torch.fft``, ``stft``/``istft`` and window functions, and torchaudio's mel filter banks
and ``Spectrogram``/``MelSpectrogram`` modules, for ember.

Installed, it publishes ``ember.fft`` (:mod:`ember_signal.fft`), ``ember.stft``/``ember.istft``
(:mod:`ember_signal.spectral`), ``ember.signal`` (:mod:`ember_signal.signal`: ``windows``, ``melscale_fbanks``,
``Spectrogram``, ``MelSpectrogram``, ``MelScale``) and the window factories ``ember.hann_window`` & co.
"""

from __future__ import annotations

__version__ = "0.1.0"
CONTRACT = 1

__all__ = ["__version__", "CONTRACT"]
