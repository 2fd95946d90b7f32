"""Elementwise ONNX ops: math, activations, comparisons, logic, bitwise, casts."""

from __future__ import annotations

from typing import Any

import ember
import ember.nn.functional as F
from ember import Tensor

from ..dtypes import to_ember_dtype
from .registry import Node, register

_UNARY = {
    "Abs": ember.abs, "Neg": ember.neg, "Exp": ember.exp, "Log": ember.log, "Sqrt": ember.sqrt,
    "Floor": ember.floor, "Ceil": ember.ceil, "Round": ember.round, "Sign": ember.sign, "Sin": ember.sin,
    "Cos": ember.cos, "Tan": ember.tan, "Asin": ember.asin, "Acos": ember.acos, "Atan": ember.atan,
    "Sinh": ember.sinh, "Cosh": ember.cosh, "Asinh": ember.asinh, "Acosh": ember.acosh, "Atanh": ember.atanh,
    "Erf": ember.erf, "Sigmoid": ember.sigmoid, "Tanh": ember.tanh, "Relu": ember.relu, "Not": ember.logical_not,
    "IsNaN": ember.isnan, "Softsign": F.softsign, "BitwiseNot": ember.bitwise_not, "HardSwish": F.hardswish,
    "Mish": F.mish,
}


def _unary(fn: Any) -> Any:
    def run(node: Node, x: Tensor) -> Tensor:
        return fn(x)

    return run


for _name, _fn in _UNARY.items():
    register(_name)(_unary(_fn))


@register("Reciprocal")
def reciprocal(node: Node, x: Tensor) -> Tensor:
    return ember.reciprocal(x)


@register("Identity")
def identity(node: Node, x: Any) -> Any:
    return x


@register("Softplus")
def softplus(node: Node, x: Tensor) -> Tensor:
    # ONNX Softplus is log(1 + exp(x)) without torch's threshold shortcut; logaddexp is the stable form
    return ember.logaddexp(x, ember.zeros_like(x))


_BINARY = {
    "Add": ember.add, "Sub": ember.sub, "Mul": ember.mul, "And": ember.logical_and, "Or": ember.logical_or,
    "Xor": ember.logical_xor, "Equal": ember.eq, "Less": ember.lt, "LessOrEqual": ember.le, "Greater": ember.gt,
    "GreaterOrEqual": ember.ge, "BitwiseAnd": ember.bitwise_and, "BitwiseOr": ember.bitwise_or,
    "BitwiseXor": ember.bitwise_xor,
}


def _binary(fn: Any) -> Any:
    def run(node: Node, a: Tensor, b: Tensor) -> Tensor:
        return fn(a, b)

    return run


for _name, _fn in _BINARY.items():
    register(_name)(_binary(_fn))


@register("Div")
def div(node: Node, a: Tensor, b: Tensor) -> Tensor:
    # integer Div truncates toward zero (C semantics), as ONNX's reference
    if a.dtype.is_floating_point:
        return ember.div(a, b)
    return ember.div(a, b, rounding_mode="trunc").to(a.dtype)


@register("Mod")
def mod(node: Node, a: Tensor, b: Tensor) -> Tensor:
    # fmod=1: sign of the dividend (C fmod); fmod=0: sign of the divisor (Python %), integers only
    return ember.fmod(a, b) if node.attr("fmod", 0) else ember.remainder(a, b)


@register("Pow")
def pow_(node: Node, a: Tensor, b: Tensor) -> Tensor:
    # the output has the base's type; an exponent of another type is applied in the wider float type
    if a.dtype == b.dtype:
        return ember.pow(a, b)
    wide = ember.float64
    return ember.pow(a.to(wide), b.to(wide)).to(a.dtype)


@register("BitShift")
def bit_shift(node: Node, a: Tensor, b: Tensor) -> Tensor:
    if node.attr("direction") == "LEFT":
        return ember.bitwise_left_shift(a, b)
    return ember.bitwise_right_shift(a, b)


@register("Max", "Min", "Sum", "Mean")
def variadic(node: Node, *xs: Tensor) -> Tensor:
    fn = {"Max": ember.maximum, "Min": ember.minimum, "Sum": ember.add, "Mean": ember.add}[node.op_type]
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    if node.op_type == "Mean":
        out = out / len(xs)
    return out


@register("Where")
def where(node: Node, cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return ember.where(cond, a, b)


@register("Clip")
def clip(node: Node, x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None) -> Tensor:
    if node.opset < 11:
        lo_v, hi_v = node.attr("min"), node.attr("max")
        out = x if lo_v is None else ember.clamp_min(x, lo_v)
        return out if hi_v is None else ember.clamp_max(out, hi_v)
    out = x if lo is None else ember.maximum(x, lo.to(x.dtype))
    return out if hi is None else ember.minimum(out, hi.to(x.dtype))


@register("IsInf")
def isinf(node: Node, x: Tensor) -> Tensor:
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if pos and neg:
        return ember.isinf(x)
    if pos:
        return ember.isposinf(x)
    if neg:
        return ember.isneginf(x)
    return ember.zeros_like(x, dtype=ember.bool_)


@register("Cast")
def cast(node: Node, x: Tensor) -> Tensor:
    return x.to(to_ember_dtype(node.attr("to"), "Cast"))


@register("CastLike")
def cast_like(node: Node, x: Tensor, like: Tensor) -> Tensor:
    return x.to(like.dtype)


# -- activations with attributes ------------------------------------------------------------------------------
@register("LeakyRelu")
def leaky_relu(node: Node, x: Tensor) -> Tensor:
    return F.leaky_relu(x, node.attr("alpha", 0.01))


@register("Elu")
def elu(node: Node, x: Tensor) -> Tensor:
    return F.elu(x, node.attr("alpha", 1.0))


@register("Celu")
def celu(node: Node, x: Tensor) -> Tensor:
    return F.celu(x, node.attr("alpha", 1.0))


@register("Selu")
def selu(node: Node, x: Tensor) -> Tensor:
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    return gamma * ember.where(x > 0, x, alpha * (ember.exp(x) - 1))


@register("ThresholdedRelu")
def thresholded_relu(node: Node, x: Tensor) -> Tensor:
    return ember.where(x > node.attr("alpha", 1.0), x, ember.zeros_like(x))


@register("HardSigmoid")
def hard_sigmoid(node: Node, x: Tensor) -> Tensor:
    return ember.clamp(x * node.attr("alpha", 0.2) + node.attr("beta", 0.5), 0.0, 1.0)


@register("Shrink")
def shrink(node: Node, x: Tensor) -> Tensor:
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    zero = ember.zeros_like(x)
    return ember.where(x < -lambd, x + bias, ember.where(x > lambd, x - bias, zero)).to(x.dtype)


@register("PRelu")
def prelu(node: Node, x: Tensor, slope: Tensor) -> Tensor:
    return ember.where(x < 0, x * slope, x)


@register("Gelu")
def gelu(node: Node, x: Tensor) -> Tensor:
    return F.gelu(x, approximate=node.attr("approximate", "none"))


@register("Swish")
def swish(node: Node, x: Tensor) -> Tensor:
    return x * ember.sigmoid(x * node.attr("alpha", 1.0))
