"""ember plugin entry point for the NVIDIA CUDA backend (entry-point group ``ember``, name ``cuda``).

The backend is ember-cupy's: this plugin gives it the platform ``cuda``, its packaging and its description (see
:mod:`ember_cupy.plugin_hooks`).
"""

from __future__ import annotations

from ember_cupy.plugin_hooks import backend_hooks

from . import CONTRACT, __version__

PLATFORM = "cuda"

register_backends, plugin_info = backend_hooks(PLATFORM, f"NVIDIA CUDA backend on CuPy (ember-cuda {__version__})",
                                                 CONTRACT)
