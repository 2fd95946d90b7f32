"""Plugin discovery (pluggy, entry-point group ``ember``). See :mod:`ember.plugins.hookspecs`."""

from .hookspecs import CONTRACT_VERSION, hookimpl
from .manager import PluginRegistry, registry

__all__ = ["CONTRACT_VERSION", "hookimpl", "PluginRegistry", "registry"]
