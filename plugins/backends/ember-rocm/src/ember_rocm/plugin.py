"""ember plugin entry point for the AMD ROCm backend (entry-point group ``ember``, name ``rocm``).

The backend is ember-cupy's: this plugin gives it the platform ``rocm``, its packaging and its description (see
:mod:`ember_cupy.plugin_hooks`).
"""

from __future__ import annotations

from ember_cupy.plugin_hooks import backend_hooks

from . import CONTRACT, __version__

PLATFORM = "rocm"

register_backends, plugin_info = backend_hooks(PLATFORM, f"AMD ROCm backend on CuPy (ember-rocm {__version__})",
                                                 CONTRACT)
