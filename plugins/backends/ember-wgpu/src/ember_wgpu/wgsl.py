"""WGSL building blocks: compute types per dtype, loads/stores/conversions, and the scalar math library.

Every dtype computes in one WGSL type: float16 and float32 in ``f32`` (float16 is rounded once, on store, as
PyTorch's CPU kernels do), int32 in ``i32``, int64 in ``i64``, bool in ``bool`` (stored as a ``u32`` word).
The math WGSL lacks (expm1, log1p, erf, erfc, erfinv, hypot, floor division and remainder with Python's signs, NaN
tests that survive fast-math) lives in :data:`PRELUDE`, included in every generated shader; functions a shader
does not call cost nothing (the compiler drops them).
"""

from __future__ import annotations

from ember import dtypes as dt
from ember.dtypes import DType
from ember.opinfo import PREDICATE_UNARY_OPS as PREDICATES  # noqa: F401 - the unary ops that return bool

from .array import STORAGE

#: 8- and 16-bit integers live in one i32 word per element and wrap to their width on every store
_WRAP = {dt.int8: "(({v}) << 24u) >> 24u", dt.int16: "(({v}) << 16u) >> 16u", dt.uint8: "(({v}) & 255)"}


def ctype(dtype: DType) -> str:
    """The WGSL type ``dtype`` computes in."""
    if dtype.is_floating_point:
        return "f32"
    if dtype is dt.bool_:
        return "bool"
    return "i64" if dtype is dt.int64 else "i32"


def stype(dtype: DType) -> str:
    """The WGSL storage element type of ``dtype``."""
    return STORAGE[dtype][0]


def load(dtype: DType, raw: str) -> str:
    """The compute-type value of the storage expression ``raw``."""
    s = stype(dtype)
    if s == "f16":
        return f"f32({raw})"
    if s == "u32":
        return f"({raw} != 0u)"
    return raw


def store(dtype: DType, value: str) -> str:
    """The storage expression of the compute-type ``value`` (already of ``ctype(dtype)``)."""
    s = stype(dtype)
    if s == "f16":
        return f"f16(clamp_f16({value}))"
    if s == "u32":
        return f"select(0u, 1u, {value})"
    wrap = _WRAP.get(dtype)
    return wrap.format(v=value) if wrap else value


def convert(value: str, src: str, dst: str) -> str:
    """``value`` of compute type ``src`` as compute type ``dst`` (float -> int truncates toward zero)."""
    if src == dst:
        return value
    if dst == "bool":
        return truth(value, src)
    if src == "bool":
        return f"select({dst}(0), {dst}(1), {value})"
    if src == "f32":
        return f"{dst}(trunc_nan0({value}))"  # NaN -> 0 and saturation, as WGSL defines the conversion
    return f"{dst}({value})"


def header(dtypes: list[DType]) -> str:
    """The ``enable`` directives the storage types of ``dtypes`` need."""
    return "enable f16;\n" if any(stype(d) == "f16" for d in dtypes) else ""


# The scalar math library. Written for f32; integer helpers for i32 and i64 are generated from one template.
PRELUDE_F32 = r"""
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn f_nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn f_inf() -> f32 { return bitcast<f32>(0x7f800000u); }
fn trunc_nan0(x: f32) -> f32 { return select(trunc(x), 0.0, is_nan(x)); }
fn clamp_f16(x: f32) -> f32 {
  // values beyond float16's range round to +-inf (WGSL leaves the out-of-range conversion undefined)
  if (abs(x) >= 65520.0 && !is_nan(x)) { return select(-f_inf(), f_inf(), x > 0.0); }
  return x;
}
fn f_sign(x: f32) -> f32 { if (is_nan(x)) { return 0.0; } return sign(x); }
fn f_copysign(a: f32, b: f32) -> f32 {
  return bitcast<f32>((bitcast<u32>(a) & 0x7fffffffu) | (bitcast<u32>(b) & 0x80000000u));
}
fn f_signbit(x: f32) -> bool { return (bitcast<u32>(x) & 0x80000000u) != 0u; }
fn f_expm1(x: f32) -> f32 {
  if (abs(x) < 1e-5) { return x + 0.5 * x * x; }
  let u = exp(x);
  if (u == 1.0) { return x; }
  let um1 = u - 1.0;
  if (um1 == -1.0) { return -1.0; }
  if (is_inf(u)) { return u; }
  return um1 * x / log(u);  // Kahan's correction: the rounding of u cancels out
}
fn f_log1p(x: f32) -> f32 {
  if (abs(x) < 0.25) {
    // 2 atanh(s), s = x / (2 + x): a relative-accurate series where log(1 + x) would lose digits
    let s = x / (2.0 + x);
    let z = s * s;
    return 2.0 * s * (1.0 + z * (0.33333333333 + z * (0.2 + z * (0.14285714286 + z * (0.11111111111 +
           z * 0.09090909091)))));
  }
  if (is_inf(x) && x > 0.0) { return x; }
  return log(1.0 + x);
}
fn f_atan(x: f32) -> f32 {
  // Cephes atanf (range reduction to |z| <= tan(pi/8), then a degree-9 odd polynomial): within 2 ulp
  let a = abs(x);
  var y0 = 0.0;
  var z = a;
  if (a > 2.414213562373095) { y0 = 1.5707963267948966; z = -1.0 / a; }
  else if (a > 0.41421356237309503) { y0 = 0.7853981633974483; z = (a - 1.0) / (a + 1.0); }
  let zz = z * z;
  let y = y0 + ((((8.05374449538e-2 * zz - 1.38776856032e-1) * zz + 1.99777106478e-1) * zz
          - 3.33329491539e-1) * zz * z + z);
  return f_copysign(y, x);
}
fn f_asin(x: f32) -> f32 {
  // Cephes asinf
  let a = abs(x);
  if (a > 1.0 || is_nan(x)) { return f_nan(); }
  var z: f32;
  var s: f32;
  let big = a > 0.5;
  if (big) { z = 0.5 * (1.0 - a); s = sqrt(z); } else { z = a * a; s = a; }
  var y = ((((4.2163199048e-2 * z + 2.4181311049e-2) * z + 4.5470025998e-2) * z + 7.4953002686e-2) * z
          + 1.6666752422e-1) * z * s + s;
  if (big) { y = 1.5707963267948966 - 2.0 * y; }
  return f_copysign(y, x);
}
fn f_acos(x: f32) -> f32 {
  if (abs(x) > 1.0 || is_nan(x)) { return f_nan(); }
  if (x < -0.5) { return 3.141592653589793 - 2.0 * f_asin(sqrt(0.5 * (1.0 + x))); }
  if (x > 0.5) { return 2.0 * f_asin(sqrt(0.5 * (1.0 - x))); }
  return 1.5707963267948966 - f_asin(x);
}
fn f_atan2(y: f32, x: f32) -> f32 {
  if (is_nan(x) || is_nan(y)) { return f_nan(); }
  if (is_inf(y)) {
    if (is_inf(x)) { return f_copysign(select(0.7853981633974483, 2.356194490192345, x < 0.0), y); }
    return f_copysign(1.5707963267948966, y);
  }
  if (x == 0.0) {
    if (y == 0.0) { return f_copysign(select(0.0, 3.141592653589793, f_signbit(x)), y); }
    return f_copysign(1.5707963267948966, y);
  }
  let r = f_atan(y / x);
  if (x > 0.0) { return r; }
  return r + f_copysign(3.141592653589793, y);
}
fn f_sigmoid(x: f32) -> f32 {
  let e = exp(-abs(x));
  return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}
fn f_tanh(x: f32) -> f32 {
  let a = abs(x);
  if (is_nan(x)) { return x; }
  if (a < 0.55) { let e = f_expm1(2.0 * a); return f_copysign(e / (e + 2.0), x); }
  if (a > 20.0) { return f_copysign(1.0, x); }
  return f_copysign(1.0 - 2.0 / (exp(2.0 * a) + 1.0), x);
}
fn f_sinh(x: f32) -> f32 {
  let a = abs(x);
  if (a < 1.0) { let e = f_expm1(a); return f_copysign(0.5 * (e + e / (e + 1.0)), x); }
  return f_copysign(exp(a - 0.69314718056) - 0.25 / exp(a - 0.69314718056), x);
}
fn f_cosh(x: f32) -> f32 {
  let a = abs(x);
  return exp(a - 0.69314718056) + 0.25 / exp(a - 0.69314718056);
}
fn f_asinh(x: f32) -> f32 {
  let a = abs(x);
  if (a > 1e18) { return f_copysign(log(a) + 0.69314718056, x); }
  return f_copysign(f_log1p(a + a * a / (1.0 + sqrt(1.0 + a * a))), x);
}
fn f_acosh(x: f32) -> f32 {
  if (x < 1.0) { return f_nan(); }
  if (x > 1e18) { return log(x) + 0.69314718056; }
  let t = x - 1.0;
  return f_log1p(t + sqrt(2.0 * t + t * t));
}
fn f_atanh(x: f32) -> f32 {
  let a = abs(x);
  if (a > 1.0) { return f_nan(); }
  return f_copysign(0.5 * f_log1p(2.0 * a / (1.0 - a)), x);
}
fn f_log10(x: f32) -> f32 { return log2(x) * 0.30102999566398120; }
fn f_sinc(x: f32) -> f32 {
  if (x == 0.0) { return 1.0; }
  let y = 3.14159265358979 * x;
  return sin(y) / y;
}
fn f_erfc_big(a: f32) -> f32 {
  // Numerical Recipes' erfc (Chebyshev fit, relative error < 1.2e-7) for a >= 0
  let t = 1.0 / (1.0 + 0.5 * a);
  let p = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 +
          t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  return t * exp(p);
}
fn f_erf(x: f32) -> f32 {
  let a = abs(x);
  if (is_nan(x)) { return x; }
  if (a < 0.5) {
    // Taylor series: no cancellation near 0
    let z = x * x;
    return x * (1.1283791671 + z * (-0.3761263890 + z * (0.1128379167 + z * (-0.0268661706 +
           z * (0.0052239776 + z * -0.0008548327)))));
  }
  return f_copysign(1.0 - f_erfc_big(a), x);
}
fn f_erfc(x: f32) -> f32 {
  if (is_nan(x)) { return x; }
  if (abs(x) < 0.5) { return 1.0 - f_erf(x); }
  if (x > 0.0) { return f_erfc_big(x); }
  return 2.0 - f_erfc_big(-x);
}
fn f_erfinv(x: f32) -> f32 {
  // Giles' single-precision approximation, refined by two Newton steps on erf
  let a = abs(x);
  if (a > 1.0 || is_nan(x)) { return f_nan(); }
  if (a == 1.0) { return f_copysign(f_inf(), x); }
  var w = -log((1.0 - a) * (1.0 + a));
  var p: f32;
  if (w < 5.0) {
    w = w - 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w; p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w; p = 2.83297682 + p * w;
  }
  var z = p * a;
  if (a < 0.9) {
    for (var k = 0; k < 2; k++) {
      z = z - (f_erf(z) - a) / (1.1283791671 * exp(-z * z));
    }
  }
  return f_copysign(z, x);
}
fn f_hypot(a: f32, b: f32) -> f32 {
  let x = abs(a);
  let y = abs(b);
  if (is_inf(x) || is_inf(y)) { return f_inf(); }
  if (is_nan(x) || is_nan(y)) { return f_nan(); }
  let m = max(x, y);
  if (m == 0.0) { return 0.0; }
  let u = x / m;
  let v = y / m;
  return m * sqrt(u * u + v * v);
}
fn f_fmod(a: f32, b: f32) -> f32 {
  // C's fmod, exact for quotients below 2**24: one fused a - b*q, then a correction of q's rounding
  if (b == 0.0 || is_inf(a) || is_nan(a) || is_nan(b)) { return f_nan(); }
  let ab = abs(b);
  if (is_inf(b) || abs(a) < ab) { return a; }
  let q = trunc(a / b);
  var r = fma(-b, q, a);
  if (a >= 0.0 && r < 0.0) { r = r + ab; }
  if (a < 0.0 && r > 0.0) { r = r - ab; }
  if (abs(r) >= ab) { r = r - f_copysign(ab, r); }
  return f_copysign(r, a);
}
fn f_remainder(a: f32, b: f32) -> f32 {
  var m = f_fmod(a, b);
  if (m != 0.0 && ((b < 0.0) != (m < 0.0))) { m = m + b; }
  return m;
}
fn f_floor_divide(a: f32, b: f32) -> f32 {
  // PyTorch's div_floor: exact quotient of the representable remainder, then a correction step
  if (b == 0.0) { return a / b; }
  let m = f_fmod(a, b);
  var d = (a - m) / b;
  if (m != 0.0 && ((b < 0.0) != (m < 0.0))) { d = d - 1.0; }
  if (d == 0.0) { return f_copysign(0.0, a / b); }
  var f = floor(d);
  if (d - f > 0.5) { f = f + 1.0; }
  return f;
}
fn f_pow(a: f32, b: f32) -> f32 {
  if (b == 0.0 || a == 1.0) { return 1.0; }
  if (is_nan(a) || is_nan(b)) { return f_nan(); }
  let ab = abs(a);
  if (is_inf(b)) {
    if (ab == 1.0) { return 1.0; }
    return select(0.0, f_inf(), (ab > 1.0) == (b > 0.0));
  }
  let bi = trunc(b);
  let odd = bi == b && abs(b) < 16777216.0 && (i32(abs(b)) % 2) == 1;
  if (a == 0.0) {
    let r = select(0.0, f_inf(), b < 0.0);
    return select(r, f_copysign(r, a), odd);
  }
  if (is_inf(a)) {
    let r = select(0.0, f_inf(), b > 0.0);
    return select(r, f_copysign(r, a), odd);
  }
  if (a < 0.0 && bi != b) { return f_nan(); }
  var r: f32;
  if (bi == b && abs(b) <= 64.0) {
    // small integral exponents by squaring: exact where PyTorch's pow is (x**2, x**3, ...)
    var e = i32(abs(b));
    var base = ab;
    r = 1.0;
    loop {
      if (e == 0) { break; }
      if ((e & 1) == 1) { r = r * base; }
      base = base * base;
      e = e >> 1u;
    }
    if (b < 0.0) { r = 1.0 / r; }
  } else {
    r = exp2(b * log2(ab));
  }
  return select(r, -r, a < 0.0 && odd);
}
fn f_maximum(a: f32, b: f32) -> f32 { if (is_nan(a)) { return a; } if (is_nan(b)) { return b; } return max(a, b); }
fn f_minimum(a: f32, b: f32) -> f32 { if (is_nan(a)) { return a; } if (is_nan(b)) { return b; } return min(a, b); }
fn f_fmax(a: f32, b: f32) -> f32 { if (is_nan(a)) { return b; } if (is_nan(b)) { return a; } return max(a, b); }
fn f_fmin(a: f32, b: f32) -> f32 { if (is_nan(a)) { return b; } if (is_nan(b)) { return a; } return min(a, b); }
"""

_INT_TEMPLATE = r"""
fn T_floor_divide(a: T, b: T) -> T {
  if (b == T(0)) { return T(0); }
  var q = a / b;
  if ((a % b) != T(0) && ((a < T(0)) != (b < T(0)))) { q = q - T(1); }
  return q;
}
fn T_remainder(a: T, b: T) -> T {
  if (b == T(0)) { return T(0); }
  var m = a % b;
  if (m != T(0) && ((m < T(0)) != (b < T(0)))) { m = m + b; }
  return m;
}
fn T_fmod(a: T, b: T) -> T { if (b == T(0)) { return T(0); } return a % b; }
fn T_pow(a: T, b: T) -> T {
  if (b < T(0)) {
    if (a == T(1)) { return T(1); }
    if (a == T(-1)) { return select(T(1), T(-1), (b % T(2)) != T(0)); }
    return T(0);
  }
  var r = T(1);
  var base = a;
  var e = b;
  loop {
    if (e == T(0)) { break; }
    if ((e & T(1)) == T(1)) { r = r * base; }
    base = base * base;
    e = e >> 1u;
  }
  return r;
}
fn T_shl(a: T, b: T) -> T { if (b < T(0) || b >= T(BITS)) { return T(0); } return a << u32(b); }
fn T_shr(a: T, b: T) -> T {
  if (b < T(0) || b >= T(BITS)) { return select(T(0), T(-1), a < T(0)); }
  return a >> u32(b);
}
fn T_sign(a: T) -> T { return select(select(T(0), T(1), a > T(0)), T(-1), a < T(0)); }
"""

PRELUDE = (PRELUDE_F32 + _INT_TEMPLATE.replace("T_", "i32_").replace("T(", "i32(").replace("a: T", "a: i32")
           .replace("b: T", "b: i32").replace("-> T", "-> i32").replace("BITS", "32"))


def prelude(dtypes: list[DType]) -> str:
    """The math library for shaders over ``dtypes`` (the i64 helpers only when int64 is involved)."""
    text = PRELUDE
    if any(d is dt.int64 for d in dtypes):
        text += (_INT_TEMPLATE.replace("T_", "i64_").replace("T(", "i64(").replace("a: T", "a: i64")
                 .replace("b: T", "b: i64").replace("-> T", "-> i64").replace("BITS", "64"))
    return text


# -- elementwise op expressions: {a} and {b} are compute-type values of the operands -------------------------------
FLOAT_UNARY: dict[str, str] = {
    "neg": "-{a}", "abs": "abs({a})", "sign": "f_sign({a})", "exp": "exp({a})", "exp2": "exp2({a})",
    "expm1": "f_expm1({a})", "log": "log({a})", "log2": "log2({a})", "log10": "f_log10({a})",
    "log1p": "f_log1p({a})", "sqrt": "sqrt({a})", "rsqrt": "(1.0 / sqrt({a}))", "reciprocal": "(1.0 / {a})",
    "sin": "sin({a})", "cos": "cos({a})", "tan": "tan({a})", "asin": "f_asin({a})", "acos": "f_acos({a})",
    "atan": "f_atan({a})", "sinh": "f_sinh({a})", "cosh": "f_cosh({a})", "tanh": "f_tanh({a})",
    "asinh": "f_asinh({a})", "acosh": "f_acosh({a})", "atanh": "f_atanh({a})", "erf": "f_erf({a})",
    "erfc": "f_erfc({a})", "erfinv": "f_erfinv({a})", "floor": "floor({a})", "ceil": "ceil({a})",
    "round": "round({a})", "trunc": "trunc({a})", "sigmoid": "f_sigmoid({a})", "sinc": "f_sinc({a})",
    "isnan": "is_nan({a})", "isinf": "is_inf({a})", "isfinite": "!(is_nan({a}) || is_inf({a}))",
    "isposinf": "(is_inf({a}) && {a} > 0.0)", "isneginf": "(is_inf({a}) && {a} < 0.0)",
    "logical_not": "((bitcast<u32>({a}) & 0x7fffffffu) == 0u)", "signbit": "f_signbit({a})",
}

INT_UNARY: dict[str, str] = {
    "neg": "-{a}", "abs": "abs({a})", "sign": "{T}_sign({a})", "floor": "{a}", "ceil": "{a}", "round": "{a}",
    "trunc": "{a}", "isnan": "false", "isinf": "false", "isfinite": "true", "isposinf": "false",
    "isneginf": "false", "logical_not": "({a} == {T}(0))", "bitwise_not": "~{a}", "signbit": "({a} < {T}(0))",
}

BOOL_UNARY: dict[str, str] = {
    "logical_not": "!{a}", "bitwise_not": "!{a}", "abs": "{a}", "floor": "{a}", "ceil": "{a}", "round": "{a}",
    "trunc": "{a}", "isnan": "false", "isinf": "false", "isfinite": "true", "isposinf": "false",
    "isneginf": "false", "signbit": "false", "sign": "{a}",
}

FLOAT_BINARY: dict[str, str] = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "floor_divide": "f_floor_divide({a}, {b})", "remainder": "f_remainder({a}, {b})", "fmod": "f_fmod({a}, {b})",
    "pow": "f_pow({a}, {b})", "maximum": "f_maximum({a}, {b})", "minimum": "f_minimum({a}, {b})",
    "fmax": "f_fmax({a}, {b})", "fmin": "f_fmin({a}, {b})", "atan2": "f_atan2({a}, {b})",
    "copysign": "f_copysign({a}, {b})", "hypot": "f_hypot({a}, {b})",
}

INT_BINARY: dict[str, str] = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})",
    "floor_divide": "{T}_floor_divide({a}, {b})", "remainder": "{T}_remainder({a}, {b})",
    "fmod": "{T}_fmod({a}, {b})", "pow": "{T}_pow({a}, {b})", "maximum": "max({a}, {b})",
    "minimum": "min({a}, {b})", "fmax": "max({a}, {b})", "fmin": "min({a}, {b})",
    "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})", "bitwise_xor": "({a} ^ {b})",
    "bitwise_left_shift": "{T}_shl({a}, {b})", "bitwise_right_shift": "{T}_shr({a}, {b})",
}

BOOL_BINARY: dict[str, str] = {
    "add": "({a} || {b})", "mul": "({a} && {b})", "maximum": "({a} || {b})", "minimum": "({a} && {b})",
    "fmax": "({a} || {b})", "fmin": "({a} && {b})", "bitwise_and": "({a} && {b})", "bitwise_or": "({a} || {b})",
    "bitwise_xor": "({a} != {b})", "pow": "({a} || !{b})", "sub": "({a} != {b})",
}

COMPARE: dict[str, str] = {"eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})",
                           "gt": "({a} > {b})", "ge": "({a} >= {b})"}

LOGICAL: dict[str, str] = {"logical_and": "({a} && {b})", "logical_or": "({a} || {b})",
                           "logical_xor": "({a} != {b})"}


def truth(value: str, ct: str) -> str:
    """``value`` (compute type ``ct``) as a bool: nonzero is true (NaN too, as in PyTorch; tested on the bits, which
    no fast-math rewrite can fold)."""
    if ct == "f32":
        return f"((bitcast<u32>({value}) & 0x7fffffffu) != 0u)"
    return value if ct == "bool" else f"({value} != {ct}(0))"


def unary_expr(op: str, ct: str, a: str) -> str | None:
    """The WGSL expression of unary ``op`` on value ``a`` of compute type ``ct`` (None: not defined there)."""
    table = FLOAT_UNARY if ct == "f32" else BOOL_UNARY if ct == "bool" else INT_UNARY
    tmpl = table.get(op)
    return None if tmpl is None else tmpl.format(a=a, T=ct)


def binary_expr(op: str, ct: str, a: str, b: str) -> str | None:
    """The WGSL expression of binary ``op`` on values ``a``, ``b`` of compute type ``ct`` (None: not defined
    there). Comparisons and logical ops yield bool; NaN compares unequal without relying on IEEE folding."""
    if op in LOGICAL:
        return LOGICAL[op].format(a=truth(a, ct), b=truth(b, ct))
    if op in COMPARE:
        if ct == "bool":  # WGSL orders numbers, not bools
            return COMPARE[op].format(a=f"u32({a})", b=f"u32({b})")
        expr = COMPARE[op].format(a=a, b=b)
        if ct == "f32" and op == "ne":
            return f"({a} != {b} || is_nan({a}) || is_nan({b}))"
        if ct == "f32":
            return f"({expr} && !is_nan({a}) && !is_nan({b}))"
        return expr
    table = FLOAT_BINARY if ct == "f32" else BOOL_BINARY if ct == "bool" else INT_BINARY
    tmpl = table.get(op)
    return None if tmpl is None else tmpl.format(a=a, b=b, T=ct)
