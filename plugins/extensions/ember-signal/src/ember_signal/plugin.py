"""ember plugin entry point for ember-signal (entry-point group ``ember``, name ``signal``).

It publishes, through ``register_namespaces`` (imported lazily, on first use): ``ember.fft`` (:mod:`ember_signal.fft`),
``ember.stft`` / ``ember.istft`` (:mod:`ember_signal.spectral`), ``ember.signal`` (:mod:`ember_signal.signal`) and
PyTorch's window factories ``ember.hann_window``, ``hamming_window``, ``blackman_window``, ``bartlett_window``,
``kaiser_window`` (:mod:`ember_signal.windows`). The transforms' ops register with ``ember.backend_extension`` (and
their flex kernels) when :mod:`ember_signal.fft` is first imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.plugins import hookimpl

from . import __version__

WINDOW_FACTORIES = ("hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window")


@hookimpl
def register_namespaces(register: Any) -> None:
    """``ember.fft``, ``ember.stft``, ``ember.istft``, ``ember.signal`` and the ``ember.*_window`` factories."""
    register("fft", "ember_signal.fft")
    register("stft", "ember_signal.spectral:stft")
    register("istft", "ember_signal.spectral:istft")
    register("signal", "ember_signal.signal")
    for name in WINDOW_FACTORIES:
        register(name, f"ember_signal.windows:{name}")


@hookimpl
def plugin_info() -> dict[str, Any]:
    """What ``ember info`` shows for ember-signal: its version and where its kernels run."""
    return {"ember-signal": __version__,
            "kernels": "scipy.fft (pocketfft) on flex; host fallback on backends with complex dtypes"}


# `ember bench signal` (entry-point group ``ember.benchmarks``): the script ships in this package, so an absolute
# path is registered and the benchmark runs from an installed wheel too
SIGNAL_BENCHMARK = {
    "description": "ember.fft / stft / MelSpectrogram (ember-signal, pocketfft on flex) vs torch: forward and "
                   "forward+backward on a few sizes",
    "script": str(Path(__file__).with_name("bench.py")),
}
