"""The op registry: one :class:`OpInfo` entry per elementwise op (in the spirit of PyTorch's OpInfo).

Everything that used to list op names by hand reads this table instead:

* the backend contract's lists (:data:`UNARY_OPS`, :data:`BINARY_OPS`, :data:`COMPARISON_OPS`,
  :data:`PREDICATE_UNARY_OPS`), re-exported by :mod:`ember.backend`;
* the front-door functions, aliases and in-place twins of :mod:`ember.ops.pointwise` (``ember.exp``,
  ``ember.arcsin``, ``Tensor.exp_``) and the Python operators :func:`ember.tensor.install_operators` attaches;
* the dtype rules of :mod:`ember.ops.elementwise` (which ops compute in the default float dtype, which return bool);
* the conformance kit's parametrisation (``ember.testing.test_elementwise``, ``test_autograd``): which ops, on
  which value domain, against which torch function, with which float32 tolerance;
* the op table of the documentation (``docs/_ext/ember_ops.py``).

So adding a unary op touches its entry here, the backends that give it a kernel, and its gradient rule (see "Adding
an op" in docs/architecture.md). This module is a leaf: it imports nothing from ember, so every layer can read it.

Scope: every elementwise op -- the contract primitives (``backend.unary`` / ``backend.binary``) and the pointwise
compositions of :mod:`ember.ops.pointwise`. Reductions, shape and indexing ops keep their own modules' tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["primitive", "composition"]

#: dtype rules, by name (the ``dtypes`` field). Binary rules apply to the promoted dtype of both operands.
DTYPE_RULES: dict[str, str] = {
    "same": "the (promoted) input dtype",
    "float": "the (promoted) input dtype; bool and integer inputs compute in the default float dtype",
    "bool": "bool (predicates, comparisons and logical ops)",
    "integral": "the (promoted) input dtype; integer and bool inputs only (floating inputs raise DTypeError)",
}

#: value domains (the ``domain`` field): where an op is smooth and finite, so gradient checks and samples stay
#: inside it. The kit turns each into a sampler; the docs print the description.
DOMAINS: dict[str, str] = {
    "real": "all reals",
    "positive": "x > 0 (samples in [0.3, 3])",
    "above_minus_one": "x > -1 (samples in [-0.6, 2])",
    "above_one": "x > 1 (samples in [1.2, 3])",
    "open_unit": "-1 < x < 1 (samples in [-0.9, 0.9])",
    "half_period": "|x| < pi/2 (samples in [-1.2, 1.2])",
    "nonzero": "x != 0 (kinks or poles at 0)",
    "off_integers": "away from the integers (step functions: the gradient is zero between the jumps)",
    "integers": "integer or bool tensors",
    "bools": "any dtype; read as truth values",
}

#: the float samples of the conformance kit (the ``samples`` field)
SAMPLES: dict[str, str] = {
    "special": "finite values of both signs, +-0.0, NaN and +-inf",
    "unit": "values in (-1, 1) (the op is only accurate to compare inside its domain)",
}


@dataclass(frozen=True)
class OpInfo:
    """One elementwise op: its names, dtype rule, where it is implemented and how the kit samples it.

    Attributes:
        name: the op's name: ``ember.<name>``, and for primitives the name backends receive in ``unary``/``binary``.
        arity: number of tensor operands (1 unary, 2 binary, 3 ternary).
        kind: ``"primitive"`` (a name of the backend contract: every backend kernels it) or ``"composition"``
            (written in other ops in :attr:`module`; backends never see it).
        dtypes: the result-dtype rule, a key of :data:`DTYPE_RULES`.
        functions: the names exported as ``ember.<fn>`` (the op's name first, then aliases such as ``arcsin``).
        methods: the :class:`~ember.tensor.Tensor` method names (in-place twins end in ``_``).
        operators: the Python operator names bound to the op (``__add__ __radd__ __iadd__``; comparisons and unary
            operators have one).
        custom: the front door is hand-written in :attr:`module` (extra arguments, such as ``add``'s ``alpha``);
            otherwise :mod:`ember.ops.pointwise` generates it, and the in-place twin, from this entry.
        module: where the front-door function lives.
        differentiable: whether gradients flow through it (``grad`` says how).
        grad: ``"smooth"`` (a gradient rule or the composition's), ``"zero"`` (step functions: zero everywhere, as
            PyTorch) or ``"none"`` (bool/integer outputs: untracked).
        domain: a key of :data:`DOMAINS`, where the op is smooth and finite.
        samples: a key of :data:`SAMPLES`, the float values the conformance kit compares on.
        torch: the torch function the kit compares with (``torch.<torch>``).
        loose_float32: torch rounds this op differently in float32: the kit compares a little looser there.
        int_rhs: integer operands' second operand in the kit: ``"nonzero"`` (division), ``"shift"`` (shift amounts
            0..5) or ``"exponent"`` (non-negative powers).
        doc: one line for the op table.
    """

    name: str
    arity: int
    kind: Kind
    dtypes: str
    functions: tuple[str, ...]
    methods: tuple[str, ...]
    operators: tuple[str, ...] = ()
    custom: bool = False
    module: str = "ember.ops.pointwise"
    differentiable: bool = True
    grad: str = "smooth"
    domain: str = "real"
    samples: str = "special"
    torch: str = ""
    loose_float32: bool = False
    int_rhs: str | None = None
    doc: str = ""
    aliases: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.dtypes not in DTYPE_RULES:
            raise ValueError(f"OpInfo {self.name!r}: unknown dtype rule {self.dtypes!r}")
        if self.domain not in DOMAINS or self.samples not in SAMPLES:
            raise ValueError(f"OpInfo {self.name!r}: unknown domain {self.domain!r} or samples {self.samples!r}")
        if not self.torch:
            object.__setattr__(self, "torch", self.name)

    @property
    def inplace(self) -> bool:
        """Whether the op has a Tensor in-place twin ``<name>_``."""
        return self.name + "_" in self.methods


def _unary(name: str, dtypes: str, *, aliases: str = "", inplace: bool = True, operators: str = "",
           grad: str = "smooth", domain: str = "real", custom: bool = False, **kw: object) -> OpInfo:
    """A unary primitive: ``ember.<name>``, ``Tensor.<name>`` and (unless inplace=False) ``Tensor.<name>_``."""
    al = tuple(aliases.split())
    method_aliases = tuple(a for a in al if not a.endswith("!"))  # "name!" exports a function only
    al = tuple(a.rstrip("!") for a in al)
    methods = (name, *(a for a in method_aliases), *((name + "_",) if inplace else ()))
    return OpInfo(name, 1, "primitive", dtypes, (name, *al), methods, tuple(operators.split()), custom=custom,
                  differentiable=grad != "none", grad=grad, domain=domain, aliases=al, **kw)  # type: ignore[arg-type]


def _binary(name: str, dtypes: str, *, aliases: str = "", inplace: bool = False, operators: str = "",
            grad: str = "none", custom: bool = False, **kw: object) -> OpInfo:
    """A binary primitive; ``operators`` are the forward, reflected and in-place dunders (or one, for comparisons)."""
    al = tuple(aliases.split())
    methods = (name, *al, *((name + "_",) if inplace else ()))
    return OpInfo(name, 2, "primitive", dtypes, (name, *al), methods, tuple(operators.split()), custom=custom,
                  differentiable=grad != "none", grad=grad, aliases=al, **kw)  # type: ignore[arg-type]


def _comp(name: str, arity: int, dtypes: str, methods: str = "", *, aliases: str = "", **kw: object) -> OpInfo:
    """A composition of :mod:`ember.ops.pointwise` (always hand-written: ``custom``)."""
    al = tuple(aliases.split())
    ms = tuple(methods.split()) if methods else (name,)
    return OpInfo(name, arity, "composition", dtypes, (name, *al), ms, custom=True, aliases=al,
                  **kw)  # type: ignore[arg-type]


_F, _B, _S, _I = "float", "bool", "same", "integral"

#: every elementwise op, primitives first (in the contract's order), then the pointwise compositions
OPS: tuple[OpInfo, ...] = (
    # -- unary primitives -------------------------------------------------------------------------------------
    _unary("neg", _S, aliases="negative", operators="__neg__", doc="-x (bool refused; use logical_not)"),
    _unary("abs", _S, aliases="absolute", operators="__abs__", domain="nonzero", doc="|x| (bool refused)"),
    _unary("sign", _S, grad="zero", domain="nonzero", doc="-1, 0 or 1 (0 for NaN)"),
    _unary("exp", _F, doc="e ** x"),
    _unary("exp2", _F, loose_float32=True, doc="2 ** x"),
    _unary("expm1", _F, loose_float32=True, doc="exp(x) - 1, accurate near 0"),
    _unary("log", _F, domain="positive", doc="natural logarithm"),
    _unary("log2", _F, domain="positive", loose_float32=True, doc="base-2 logarithm"),
    _unary("log10", _F, domain="positive", loose_float32=True, doc="base-10 logarithm"),
    _unary("log1p", _F, domain="above_minus_one", loose_float32=True, doc="log(1 + x), accurate near 0"),
    _unary("sqrt", _F, domain="positive", doc="square root"),
    _unary("rsqrt", _F, domain="positive", loose_float32=True, doc="1 / sqrt(x)"),
    _unary("reciprocal", _F, domain="nonzero", doc="1 / x"),
    _unary("sin", _F, doc="sine"),
    _unary("cos", _F, doc="cosine"),
    _unary("tan", _F, domain="half_period", loose_float32=True, doc="tangent"),
    _unary("asin", _F, aliases="arcsin", domain="open_unit", doc="inverse sine"),
    _unary("acos", _F, aliases="arccos", domain="open_unit", doc="inverse cosine"),
    _unary("atan", _F, aliases="arctan", doc="inverse tangent"),
    _unary("sinh", _F, loose_float32=True, doc="hyperbolic sine"),
    _unary("cosh", _F, loose_float32=True, doc="hyperbolic cosine"),
    _unary("tanh", _F, doc="hyperbolic tangent"),
    _unary("asinh", _F, aliases="arcsinh!", loose_float32=True, doc="inverse hyperbolic sine"),
    _unary("acosh", _F, aliases="arccosh!", domain="above_one", loose_float32=True,
           doc="inverse hyperbolic cosine"),
    _unary("atanh", _F, aliases="arctanh!", domain="open_unit", loose_float32=True,
           doc="inverse hyperbolic tangent"),
    _unary("erf", _F, doc="error function"),
    _unary("erfc", _F, loose_float32=True, doc="1 - erf(x), accurate for large x"),
    _unary("erfinv", _F, domain="open_unit", samples="unit", loose_float32=True, doc="inverse error function"),
    _unary("floor", _S, grad="zero", domain="off_integers", doc="round down (integers: identity)"),
    _unary("ceil", _S, grad="zero", domain="off_integers", doc="round up (integers: identity)"),
    _unary("round", _S, grad="zero", domain="off_integers", custom=True,
           doc="round half to even; ``decimals=`` rounds to decimal places"),
    _unary("trunc", _S, grad="zero", domain="off_integers", doc="round toward zero (integers: identity)"),
    _unary("sigmoid", _F, doc="1 / (1 + exp(-x))"),
    _unary("sinc", _F, doc="sin(pi x) / (pi x), 1 at 0 (the normalized sinc)"),
    _unary("isnan", _B, inplace=False, grad="none", doc="x is NaN"),
    _unary("isinf", _B, inplace=False, grad="none", doc="x is +-inf"),
    _unary("isfinite", _B, inplace=False, grad="none", doc="x is neither NaN nor +-inf"),
    _unary("isposinf", _B, inplace=False, grad="none", doc="x is +inf"),
    _unary("isneginf", _B, inplace=False, grad="none", doc="x is -inf"),
    _unary("logical_not", _B, inplace=False, grad="none", domain="bools", doc="not x (truth value)"),
    _unary("bitwise_not", _I, inplace=False, grad="none", operators="__invert__", domain="integers",
           doc="~x (bool: logical not; ``~`` on a bool tensor is logical_not)"),
    _unary("signbit", _B, inplace=False, grad="none", doc="the sign bit is set (-0.0 included)"),
    # -- binary primitives ------------------------------------------------------------------------------------
    _binary("add", _S, inplace=True, operators="__add__ __radd__ __iadd__", grad="smooth", custom=True,
            doc="input + alpha * other"),
    _binary("sub", _S, aliases="subtract", inplace=True, operators="__sub__ __rsub__ __isub__", grad="smooth",
            custom=True, doc="input - alpha * other (bool refused)"),
    _binary("mul", _S, aliases="multiply", inplace=True, operators="__mul__ __rmul__ __imul__", grad="smooth",
            doc="input * other"),
    _binary("div", _F, aliases="divide true_divide", inplace=True,
            operators="__truediv__ __rtruediv__ __itruediv__", grad="smooth", custom=True, int_rhs="nonzero",
            doc="true division; ``rounding_mode='trunc'|'floor'``"),
    _binary("floor_divide", _S, inplace=True, operators="__floordiv__ __rfloordiv__ __ifloordiv__", grad="zero",
            int_rhs="nonzero", doc="floor(input / other) (integer division by zero raises)"),
    _binary("remainder", _S, inplace=True, operators="__mod__ __rmod__ __imod__", grad="smooth",
            int_rhs="nonzero", doc="Python's %: the sign of the divisor"),
    _binary("fmod", _S, inplace=True, grad="smooth", int_rhs="nonzero", doc="C's fmod: the sign of the dividend"),
    _binary("pow", _S, inplace=True, operators="__pow__ __rpow__ __ipow__", grad="smooth", loose_float32=True,
            int_rhs="exponent", doc="input ** other (integers to negative integer powers refused)"),
    _binary("maximum", _S, inplace=True, grad="smooth", doc="larger value, NaN propagates"),
    _binary("minimum", _S, inplace=True, grad="smooth", doc="smaller value, NaN propagates"),
    _binary("fmax", _S, grad="smooth", doc="larger value, NaN ignored"),
    _binary("fmin", _S, grad="smooth", doc="smaller value, NaN ignored"),
    _binary("atan2", _F, aliases="arctan2", inplace=True, grad="smooth", doc="angle of (other, input)"),
    _binary("copysign", _F, inplace=True, grad="smooth", doc="|input| with the sign of other"),
    _binary("hypot", _F, inplace=True, grad="smooth", loose_float32=True, doc="sqrt(input**2 + other**2)"),
    _binary("eq", _B, operators="__eq__", doc="input == other"),
    _binary("ne", _B, aliases="not_equal", operators="__ne__", doc="input != other"),
    _binary("lt", _B, aliases="less", operators="__lt__", doc="input < other"),
    _binary("le", _B, aliases="less_equal", operators="__le__", doc="input <= other"),
    _binary("gt", _B, aliases="greater", operators="__gt__", doc="input > other"),
    _binary("ge", _B, aliases="greater_equal", operators="__ge__", doc="input >= other"),
    _binary("logical_and", _B, doc="truth values: and"),
    _binary("logical_or", _B, doc="truth values: or"),
    _binary("logical_xor", _B, doc="truth values: exclusive or"),
    _binary("bitwise_and", _I, inplace=True, operators="__and__ __rand__ __iand__", doc="input & other"),
    _binary("bitwise_or", _I, inplace=True, operators="__or__ __ror__ __ior__", doc="input | other"),
    _binary("bitwise_xor", _I, inplace=True, operators="__xor__ __rxor__ __ixor__", doc="input ^ other"),
    _binary("bitwise_left_shift", _I, inplace=True, operators="__lshift__ __rlshift__ __ilshift__",
            int_rhs="shift", doc="input << other (bool refused)"),
    _binary("bitwise_right_shift", _I, inplace=True, operators="__rshift__ __rrshift__ __irshift__",
            int_rhs="shift", doc="input >> other, arithmetic (bool refused)"),
    # -- compositions (ember.ops.pointwise) -------------------------------------------------------------------
    _comp("square", 1, _S, "square", doc="input * input (bool squares as int64)"),
    _comp("frac", 1, _S, "frac", domain="off_integers", doc="input - trunc(input)"),
    _comp("positive", 1, _S, "positive", doc="input itself (bool refused)"),
    _comp("relu", 1, _S, "relu relu_", doc="max(input, 0), NaN propagates (bool refused)"),
    _comp("rsub", 2, _S, "rsub", doc="other - alpha * input"),
    _comp("clamp", 1, _S, "clamp clamp_ clip clip_", aliases="clip",
          doc="limit to [min, max] (scalar or tensor bounds; promotes with them)"),
    _comp("clamp_min", 1, _S, doc="clamp(input, min=min)"),
    _comp("clamp_max", 1, _S, doc="clamp(input, max=max)"),
    _comp("where", 3, _S, "where", doc="input where condition, else other (promoted); where(cond) is nonzero"),
    _comp("nan_to_num", 1, _S, doc="NaN, +inf, -inf replaced by numbers"),
    _comp("lerp", 3, _S, "lerp lerp_", doc="input + weight * (end - input), floating dtypes"),
    _comp("addcmul", 3, _S, "addcmul addcmul_", doc="input + value * tensor1 * tensor2 (promoted; bool refused)"),
    _comp("addcdiv", 3, _S, "addcdiv addcdiv_", doc="input + value * tensor1 / tensor2 (integer division refused)"),
    _comp("xlogy", 2, _F, doc="input * log(other), 0 where input == 0"),
    _comp("logaddexp", 2, _F, doc="log(exp(input) + exp(other)), stable"),
    _comp("isclose", 2, _B, differentiable=False, grad="none", doc="abs(input - other) <= atol + rtol * abs(other)"),
    _comp("allclose", 2, _B, differentiable=False, grad="none", doc="isclose everywhere (a Python bool)"),
    _comp("equal", 2, _B, differentiable=False, grad="none", doc="same shape and elements (a Python bool)"),
)

#: entries by name
BY_NAME: dict[str, OpInfo] = {op.name: op for op in OPS}


def select(*, arity: int | None = None, kind: Kind | None = None, dtypes: str | Iterable[str] | None = None,
           module: str | None = None) -> Iterator[OpInfo]:
    """The entries matching every given field, in table order."""
    rules = {dtypes} if isinstance(dtypes, str) else None if dtypes is None else set(dtypes)
    for op in OPS:
        if arity is not None and op.arity != arity:
            continue
        if kind is not None and op.kind != kind:
            continue
        if rules is not None and op.dtypes not in rules:
            continue
        if module is not None and op.module != module:
            continue
        yield op


def names(**criteria: object) -> frozenset[str]:
    """The names of :func:`select`'s entries (``names(arity=1, kind="primitive", dtypes="float")``)."""
    return frozenset(op.name for op in select(**criteria))  # type: ignore[arg-type]


def get(name: str) -> OpInfo:
    """The entry of ``name`` (KeyError naming the known ops otherwise)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no OpInfo entry named {name!r} (ember.opinfo.OPS has {len(OPS)} ops)") from None


# -- the backend contract's lists (ember.backend re-exports them) ---------------------------------------------------
#: the names ``Backend.unary`` receives
UNARY_OPS: frozenset[str] = names(arity=1, kind="primitive")
#: the names ``Backend.binary`` receives
BINARY_OPS: frozenset[str] = names(arity=2, kind="primitive")
#: binary primitives with a bool result
COMPARISON_OPS: frozenset[str] = names(arity=2, kind="primitive", dtypes="bool")
#: unary primitives with a bool result
PREDICATE_UNARY_OPS: frozenset[str] = names(arity=1, kind="primitive", dtypes="bool")
#: unary primitives that compute bool and integer inputs in the default float dtype
FLOAT_UNARY_OPS: frozenset[str] = names(arity=1, kind="primitive", dtypes="float")
#: binary primitives that compute bool and integer operands in the default float dtype
FLOAT_BINARY_OPS: frozenset[str] = names(arity=2, kind="primitive", dtypes="float")
#: binary primitives for integer and bool operands only
INTEGRAL_BINARY_OPS: frozenset[str] = names(arity=2, kind="primitive", dtypes="integral")

#: Python operator name -> op name (``"__radd__" -> "add"``)
OPERATORS: dict[str, str] = {dunder: op.name for op in OPS for dunder in op.operators}
