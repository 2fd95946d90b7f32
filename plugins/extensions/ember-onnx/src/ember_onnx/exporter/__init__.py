"""ONNX export: ``ember.capture`` records lowered to ONNX nodes (rules per contract op and per extension op)."""

from .export import SUPPORTED_OPSETS, export
from .lower import EXTENSION_RULES, RULES, extension_rule, rule

__all__ = ["export", "SUPPORTED_OPSETS", "RULES", "EXTENSION_RULES", "rule", "extension_rule"]
