"""Fused elementwise (and elementwise-then-reduce) kernels for flex: cache-sized blocks or numexpr where they
pay, numpy otherwise.

:func:`compile_kernel` turns an :class:`ember.ir.Kernel` into a :class:`FusedKernel`, a
:data:`ember.ir.CompiledKernel` with three equivalent execution paths:

* ``"numpy"``: the instructions one by one through the backend's own contract methods (exactly
  :func:`ember.ir.interpret`, without its per-call dispatch on the op names);
* ``"blocked"`` (elementwise kernels of at least :data:`ember_flex.fusion_blocks.BLOCKED_MIN` elements): every
  instruction over one cache-sized block before the next block starts, in reused scratch blocks, ranges of blocks
  on flex's thread pool (:mod:`ember_flex.fusion_blocks`);
* ``"numexpr"``: the instructions numexpr expresses with flex's numerics are grouped into numexpr programs (one
  pass over memory per materialised value, evaluated in cache-sized blocks on numexpr's thread pool, no full-size
  temporaries); the others (float16/bfloat16/int8/int16/uint8 values, erf, floor_divide, remainder, ...) run with
  numpy between them, through the backend as on the numpy path.

Which path a call takes is decided by measurement, per *size class* (``int(n).bit_length()`` of the element count
``n``, and whether the call writes into given targets): the first :data:`TRIALS` calls of a class run each path
alternately and are timed; afterwards the class keeps the path with the lower minimum time (see
:attr:`FusedKernel.choices`). Small arrays usually favour numpy (numexpr
costs ~10 us per call), large ones the blocked path (numexpr calls the C library's tanh and exp one element at a
time, where numpy's are vectorized).

Threads: a compiled numexpr program keeps per-call state in the program object (its operand pointers and
temporaries), so two threads must never run one program at once. Each :class:`FusedKernel` has a lock for its
programs; a call that finds it held takes the numpy path instead of waiting (the paths give identical bits).

Numerics: the blocked path is bit-identical to the numpy path (the same numpy loops on the same elements, see
:mod:`ember_flex.fusion_blocks`), and so is the numexpr path: numexpr computes only what it does exactly like
numpy (+, -, *, /, sqrt, comparisons, where, casts (upcasts and to bool), floor/ceil/trunc, rint-style round, abs,
neg, copysign, fmod, maximum/minimum, bitwise ops and shifts); transcendental functions (exp, log, tanh, sin, pow,
sigmoid, ...), where numexpr would call the C library instead of numpy's own routines and could differ by an ulp,
run as numpy steps. So the measured choice never changes a result, and identical calls always agree.

Speed: a ``where`` instruction is a numpy step too (flex's branch-free blend, ``FlexBackend.where``): numexpr's
``where`` branches on every element, ~10x slower than the blend on masks of data (relu's backward); numexpr keeps
what feeds the condition and the branches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType
from ember.ir import Instr, Kernel, interpret

from .fusion_blocks import BLOCKED_MIN, BlockPlan, backend_step, operands

#: timed calls per path and size class before the faster path is kept
TRIALS = 3
#: numexpr is kept only when its best time is below this fraction of numpy's (timings on shared machines are noisy)
NUMEXPR_MARGIN = 0.85
#: likewise the blocked path, against the best of the other two
BLOCKED_MARGIN = 0.9

#: ember dtypes numexpr computes natively, by numexpr kind
_KIND: dict[DType, str] = {dt.bool_: "bool", dt.int32: "int", dt.int64: "long", dt.float32: "float",
                           dt.float64: "double"}
_SIG_TYPE = {"bool": bool, "int": np.int32, "long": np.int64, "float": float, "double": np.double}
_NP_OF_KIND = {"bool": np.bool_, "int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}
_FLOAT_KINDS = ("float", "double")
_INT_KINDS = ("int", "long")
_RANK = {"bool": 0, "int": 1, "long": 2, "float": 3, "double": 4}

# ember op name -> numexpr function, for float operands (result of the operand's kind)
_UNARY_FUNC = {
    "abs": "absolute", "exp": "exp", "expm1": "expm1", "log": "log", "log2": "log2", "log10": "log10",
    "log1p": "log1p", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "arcsin", "acos": "arccos",
    "atan": "arctan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "arcsinh", "acosh": "arccosh",
    "atanh": "arctanh", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "round": "round",
}
_BINARY_FUNC = {"fmod": "fmod", "pow": "pow", "maximum": "maximum", "minimum": "minimum", "atan2": "arctan2",
                "copysign": "copysign", "hypot": "hypot"}
_CMP = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_ARITH = {"add": "add", "sub": "sub", "mul": "mul"}
_BITWISE = {"bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "logical_and": "and",
            "logical_or": "or", "logical_xor": "xor"}

# a shared subexpression larger than this (in expanded tree nodes) is computed once and stored, not repeated
_MAX_SHARED_TREE = 24
# numexpr programs are numpy iterators: at most 64 operands (inputs + output)
_MAX_LEAVES = 60


def _scalar_ok(value: Any, kind: str) -> bool:
    """Whether converting a Python scalar to ``kind`` gives what numpy's weak-scalar promotion in
    ``flex.binary(array, value)`` computes (a float value with an int array promotes to float64 instead)."""
    t = type(value)
    if t is bool:
        return True
    if t is int:
        return kind != "bool"
    return t is float and kind in _FLOAT_KINDS


class _NumexprPlan:
    """The kernel as a sequence of steps: numexpr programs for what numexpr does exactly, backend calls for the
    rest. Built once per kernel; raises ``_Unsupported`` where it would not pay (no numexpr step at all)."""

    def __init__(self, kernel: Kernel, backend: Any) -> None:
        from numexpr.expressions import ConstantNode, FuncNode, OpNode, VariableNode
        from numexpr.necompiler import NumExpr

        self._Const, self._Func, self._Op, self._Var = ConstantNode, FuncNode, OpNode, VariableNode
        self.kernel = kernel
        self.backend = backend
        body = kernel.body
        self.kind: list[str | None] = [_KIND.get(ins.dtype) for ins in body]
        # which instructions numexpr can compute (given numexpr-able operands): a builder per instruction
        self.ne_ok = [self._translatable(i, ins) for i, ins in enumerate(body)]
        uses = [0] * len(body)
        for ins in body:
            for j in operands(ins):
                uses[j] += 1
        # values stored as arrays: kernel outputs, operands of numpy steps, large shared subexpressions
        size = [1] * len(body)
        for i, ins in enumerate(body):
            if self.ne_ok[i] and ins.op not in ("load", "scalar"):
                size[i] = 1 + sum(size[j] for j in operands(ins))
        materialise = set(kernel.outputs)
        for i, ins in enumerate(body):
            if not self.ne_ok[i]:
                materialise.update(operands(ins))
            elif uses[i] > 1 and size[i] > _MAX_SHARED_TREE:
                materialise.add(i)
                size[i] = 1
        self.steps: list[tuple[str, int, Any]] = []
        n_ne = 0
        for i, ins in enumerate(body):
            if ins.op in ("load", "scalar"):
                continue
            if not self.ne_ok[i]:
                self.steps.append(("np", i, None))
            elif i in materialise:
                leaves: dict[str, int] = {}
                node = self._node(i, materialise, leaves, root=True)
                if len(leaves) > _MAX_LEAVES:
                    raise _Unsupported(f"numexpr program for %{i} has {len(leaves)} operands")
                names = sorted(leaves, key=lambda s: (s[0], int(s[1:])))
                sig = [(nm, _SIG_TYPE[self.kind[leaves[nm]]]) for nm in names]
                try:
                    prog = NumExpr(node, signature=sig, optimization="none")
                except (NotImplementedError, TypeError, ValueError) as e:  # no opcode for a type combination
                    raise _Unsupported(f"numexpr cannot compile %{i}: {e}") from e
                self.steps.append(("ne", i, (prog, [leaves[nm] for nm in names])))
                n_ne += 1
        if n_ne == 0:
            raise _Unsupported("no instruction maps to numexpr")
        self.materialise = materialise

    # -- translation -------------------------------------------------------------------------------------------
    def _translatable(self, i: int, ins: Instr) -> bool:
        k = self.kind[i]
        if k is None:
            return False
        op, a = ins.op, ins.args
        if op in ("load", "scalar"):
            return op == "scalar" or self.kernel.inputs[a[0]] == ins.dtype
        ops = operands(ins)
        if not all(self.kind[j] is not None for j in ops):  # operands computed by numpy are numexpr inputs
            return False
        ka = self.kind[ops[0]]
        if op == "unary":
            name = a[0]
            if ka in _FLOAT_KINDS:
                if name in ("isnan", "isinf", "isfinite", "signbit", "isposinf", "isneginf", "logical_not"):
                    return k == "bool"
                if ka != k:
                    return False
                if name in _INEXACT_UNARY:
                    return False  # numexpr's libm result may differ by an ulp: a numpy step keeps runs identical
                return name in _UNARY_FUNC or name in ("neg", "sqrt", "rsqrt", "reciprocal", "sigmoid", "sign")
            if ka in _INT_KINDS:
                if name == "logical_not":
                    return k == "bool"
                return ka == k and name in ("neg", "abs", "sign", "bitwise_not")
            return ka == k == "bool" and name in ("logical_not", "bitwise_not")
        if op == "binary":
            name = a[0]
            if ka != self.kind[ops[1]] or self.kernel.body[ops[0]].dtype is not self.kernel.body[ops[1]].dtype:
                return False
            if name in _CMP or name.startswith("logical_"):
                return k == "bool"
            if ka != k:
                return False
            if name in _ARITH or name in ("maximum", "minimum"):
                return k != "bool" or name in ("maximum", "minimum")
            if name in ("div",) or name in _BINARY_FUNC and name not in _INEXACT_BINARY:
                return k in _FLOAT_KINDS
            if name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
                return True
            if name in ("bitwise_left_shift", "bitwise_right_shift"):
                return k in _INT_KINDS
            return False  # floor_divide, remainder (numexpr's sign and zero rules differ), fmax, fmin
        if op == "where":
            return False  # a numpy step: flex's branch-free blend (see the module docstring)
        if op == "cast":
            if k == "bool":
                return True
            return _RANK[ka] <= _RANK[k] and not (ka == "long" and k == "int")
        return False

    def _zero(self, kind: str) -> Any:
        return self._Const(_NP_OF_KIND[kind](0))

    def _one(self, kind: str) -> Any:
        return self._Const(_NP_OF_KIND[kind](1))

    def _node(self, i: int, mat: set[int], leaves: dict[str, int], root: bool = False) -> Any:
        """The numexpr expression tree of instruction i (stored values and inputs are leaves)."""
        ins = self.kernel.body[i]
        k = self.kind[i]
        if ins.op == "load":
            name = f"i{ins.args[0]}"
            leaves[name] = i
            return self._Var(name, k)
        if ins.op == "scalar":
            name = f"s{ins.args[0]}"
            leaves[name] = i
            return self._Var(name, k)
        if (i in mat and not root) or not self.ne_ok[i]:
            name = f"v{i}"
            leaves[name] = i
            return self._Var(name, k)
        Op, Func = self._Op, self._Func
        ops = [self._node(j, mat, leaves) for j in operands(ins)]
        if ins.op == "unary":
            name, x = ins.args[0], ops[0]
            kx = self.kind[operands(ins)[0]]
            if name == "neg":
                return Op("neg", [x], k)
            if name == "sqrt":
                return Op("sqrt", [x], k)
            if name == "rsqrt":  # flex: reciprocal(sqrt(x))
                return Op("div", [self._one(k), Op("sqrt", [x], k)], k)
            if name == "reciprocal":
                return Op("div", [self._one(k), x], k)
            if name == "sigmoid":  # flex: e = exp(-|x|); x >= 0 ? 1/(1+e) : e/(1+e)
                e = Func("exp", [Op("neg", [Func("absolute", [x], k)], k)], k)
                d = Op("add", [self._one(k), e], k)
                pos = Op("ge", [x, self._zero(k)], "bool")
                return Func("where", [pos, Op("div", [self._one(k), d], k), Op("div", [e, d], k)], k)
            if name == "sign":
                s = Func("sign", [x], k)
                if k in _FLOAT_KINDS:  # flex (like PyTorch) maps sign(NaN) to 0
                    return Func("where", [Op("ne", [x, x], "bool"), self._zero(k), s], k)
                return s
            if name in ("isnan", "isinf", "isfinite", "signbit"):
                return Func(name, [x], "bool")
            if name in ("isposinf", "isneginf"):
                inf = self._Const(_NP_OF_KIND[kx](np.inf if name == "isposinf" else -np.inf))
                return Op("eq", [x, inf], "bool")
            if name == "logical_not":
                return Op("invert", [x], "bool") if kx == "bool" else Op("eq", [x, self._zero(kx)], "bool")
            if name == "bitwise_not":
                return Op("invert", [x], k)
            return Func(_UNARY_FUNC[name], [x], k)
        if ins.op == "binary":
            name = ins.args[0]
            x, y = ops
            kx = self.kind[operands(ins)[0]]
            if name in ("lt", "le"):  # numexpr has gt/ge only
                return Op("gt" if name == "lt" else "ge", [y, x], "bool")
            if name in _CMP:
                return Op(_CMP[name], [x, y], "bool")
            if name.startswith("logical_"):
                if kx != "bool":  # truthiness, as numpy's logical_* on numbers
                    x, y = Op("ne", [x, self._zero(kx)], "bool"), Op("ne", [y, self._zero(kx)], "bool")
                return Op(_BITWISE[name], [x, y], "bool")
            if name in _ARITH:
                return Op(_ARITH[name], [x, y], k)
            if name == "div":
                return Op("div", [x, y], k)
            if name in ("maximum", "minimum") and k not in _FLOAT_KINDS:
                ge = Op("ge", [x, y] if name == "maximum" else [y, x], "bool")  # numexpr has no le
                return Func("where", [ge, x, y], k)
            if name == "pow":
                return Op("pow", [x, y], k)
            if name in _BINARY_FUNC:
                return Func(_BINARY_FUNC[name], [x, y], k)
            if name in _BITWISE:
                return Op(_BITWISE[name], [x, y], k)
            return Op("lshift" if name == "bitwise_left_shift" else "rshift", [x, y], k)
        # cast
        kx = self.kind[operands(ins)[0]]
        x = ops[0]
        if k == "bool":
            return x if kx == "bool" else Op("ne", [x, self._zero(kx)], "bool")
        if kx == k:
            return x
        return Op("cast", [x], k)


#: functions numexpr computes with the C library, which may differ from numpy's own routines by an ulp. They run as
#: numpy steps, so that the numexpr path is bit-identical to the numpy path and which path the measurement picks
#: (it alternates while measuring) never changes a result: two identical calls always agree.
_INEXACT_UNARY = frozenset("exp expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh asinh acosh "
                           "atanh sigmoid".split())
_INEXACT_BINARY = frozenset({"pow", "atan2", "hypot"})


class _Unsupported(Exception):
    """A kernel (or part) the numexpr path does not take."""


def _step_drops(kernel: Kernel, plan: _NumexprPlan) -> list[tuple[int, ...]]:
    """Per step of ``plan``, the step-made values (not outputs) it reads for the last time, or that nothing reads
    (dropped after their own step). Loads and scalars are the caller's and stay."""
    made = {i: k for k, (_, i, _) in enumerate(plan.steps)}
    last = dict(made)
    for k, (kind_, i, payload) in enumerate(plan.steps):
        for j in (operands(kernel.body[i]) if kind_ == "np" else payload[1]):
            if j in made:
                last[j] = max(last[j], k)
    outputs = set(kernel.outputs)
    drops: list[list[int]] = [[] for _ in plan.steps]
    for j, k in last.items():
        if j not in outputs:
            drops[k].append(j)
    return [tuple(d) for d in drops]


class FusedKernel:
    """flex's :data:`ember.ir.CompiledKernel`: ``run(inputs, scalars, shape, outs) -> outputs``.

    Attributes:
        kernel: the compiled :class:`ember.ir.Kernel`.
        choices: size class (``2 * int(n).bit_length() + in_place``, n = elements of the iteration shape) ->
            ``"numpy"``, ``"numexpr"`` or ``"blocked"``, filled in once every path the class's calls can take was
            timed :data:`TRIALS` times.
        last_path: the path the latest call took (``"numpy"``, ``"numexpr"``, ``"blocked"``, or ``"numpy"`` too
            where the scalars' Python types require numpy's own promotion, e.g. a float scalar with an integer
            operand, or where the operands' layout does not suit the chosen path).
    """

    def __init__(self, kernel: Kernel, backend: Any, plan: _NumexprPlan | None, blocks: BlockPlan | None) -> None:
        self.kernel = kernel
        self.backend = backend
        self._plan = plan
        self.choices: dict[int, str] = {}
        self._timings: dict[int, dict[str, list[float]]] = {}
        self.last_path = ""
        self._numpy = _numpy_runner(kernel, backend)
        # held while a thread runs this kernel's numexpr programs (not reentrant: nothing runs kernels from inside)
        self._busy = threading.Lock()
        # scalars numexpr reads as 0-d arrays of the instruction's kind (checked per call, see _scalar_ok)
        self._scalar_kinds = [] if plan is None else [(ins.args[0], plan.kind[i]) for i, ins in
                                                       enumerate(kernel.body)
                                                       if ins.op == "scalar" and plan.kind[i] is not None]
        # per step of the numexpr path, the values it reads for the last time: dropped after it, as eager op by op
        # frees each result after its last use (a fused replay must peak no higher than eager)
        self._drops = [] if plan is None else _step_drops(kernel, plan)
        self._blocks = blocks

    def path_for(self, n: int, in_place: bool = False) -> str | None:
        """The path chosen for arrays of ``n`` elements (written into given ``outs`` when ``in_place``), or None
        while that class is still being timed."""
        return self.choices.get(_size_class(n, in_place))

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: tuple[int, ...],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        n = 1
        for s in shape:
            n *= s
        cls = _size_class(n, outs is not None and any(o is not None for o in outs))
        path = self.choices.get(cls)
        if path is not None:
            if path == "numexpr":
                r = self._try_numexpr(inputs, scalars, shape, outs)
                if r is not None:
                    self.last_path = path
                    return r
            elif path == "blocked":
                r = self._try_blocked(inputs, scalars, shape, outs)
                if r is not None:
                    self.last_path = path
                    return r
            self.last_path = "numpy"
            return self._numpy(inputs, scalars, shape, outs)
        # still measuring this size class: the path timed least so far; choose once each was timed TRIALS times
        t = self._timings.setdefault(cls, {"numpy": [], "numexpr": [], "blocked": []})
        # only the paths these scalars allow: a path that can never run must not keep the class measuring
        candidates = ["numpy"]
        if self._plan is not None and self._numexpr_scalars_ok(scalars):
            candidates.append("numexpr")
        if self._blocks is not None and n >= BLOCKED_MIN and self._blocks.scalars_ok(scalars):
            candidates.append("blocked")
        path = min(candidates, key=lambda c: len(t[c]))
        t0 = time.perf_counter()
        r = None
        if path == "numexpr":
            r = self._try_numexpr(inputs, scalars, shape, outs)
        elif path == "blocked":
            r = self._try_blocked(inputs, scalars, shape, outs)
        if r is None and path != "numpy":
            # another thread runs the numexpr programs, or these operands' layout does not suit blocks: this call
            # is judged without that path
            candidates.remove(path)
        if r is None:  # numpy's turn, or another thread is running the numexpr programs: time numpy instead
            path = "numpy"
            r = self._numpy(inputs, scalars, shape, outs)
        t[path].append(time.perf_counter() - t0)
        self.last_path = path
        if all(len(t[c]) >= TRIALS for c in candidates):
            self.choices[cls] = _choose(t)
            self._timings.pop(cls, None)  # another thread may have finished the same trials
        return r

    def run_path(self, path: str, inputs: Sequence[Any], scalars: Sequence[Any], shape: tuple[int, ...],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        """Run one path explicitly (``"numpy"``, ``"numexpr"`` or ``"blocked"``), bypassing the measured choice; for
        tests and benchmarks. ``"blocked"`` takes the numpy path where blocks do not apply to the call."""
        if path == "numpy":
            return self._numpy(inputs, scalars, shape, outs)
        if path == "blocked":
            r = self._try_blocked(inputs, scalars, shape, outs)
            return self._numpy(inputs, scalars, shape, outs) if r is None else r
        if self._plan is None or not self._numexpr_scalars_ok(scalars):
            return self._numpy(inputs, scalars, shape, outs)
        with self._busy:  # explicitly asked for numexpr: wait for another thread's run of these programs
            return self._numexpr(inputs, scalars, shape, outs)

    # -- the blocked path --------------------------------------------------------------------------------------
    def _try_blocked(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: tuple[int, ...],
                     outs: Sequence[Any] | None) -> list[Any] | None:
        """The blocked path, or None without running anything where it does not apply (a reduction, a small or
        strided call, scalars numpy would promote differently)."""
        plan = self._blocks
        if plan is None or not plan.scalars_ok(scalars):
            return None
        lay = plan.layout(inputs, tuple(shape), outs)
        if lay is None:
            return None
        it, ins, full, given, aliased = lay
        return plan.run(ins, scalars, it, full, given, aliased, outs, tuple(shape))

    # -- the numexpr path --------------------------------------------------------------------------------------
    def _numexpr_scalars_ok(self, scalars: Sequence[Any]) -> bool:
        return all(_scalar_ok(scalars[k], kind) for k, kind in self._scalar_kinds)

    def _try_numexpr(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: tuple[int, ...],
                     outs: Sequence[Any] | None) -> list[Any] | None:
        """The numexpr path, or None without running anything when another thread is running this kernel's
        programs (a numexpr program is not reentrant: concurrent runs corrupt its operand and temporary slots), or
        where a scalar's Python type asks for numpy's own promotion (numexpr would compute otherwise)."""
        if self._plan is None or not self._numexpr_scalars_ok(scalars) or not self._busy.acquire(blocking=False):
            return None
        try:
            return self._numexpr(inputs, scalars, shape, outs)
        finally:
            self._busy.release()

    def _numexpr(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: tuple[int, ...],
                 outs: Sequence[Any] | None) -> list[Any]:
        plan, kernel, be = self._plan, self.kernel, self.backend
        body = kernel.body
        vals: list[Any] = [None] * len(body)
        for i, ins in enumerate(body):  # leaves
            if ins.op == "load":
                vals[i] = inputs[ins.args[0]]
            elif ins.op == "scalar":
                v = scalars[ins.args[0]]
                kind = plan.kind[i]
                vals[i] = np.array(v, dtype=_NP_OF_KIND[kind]) if kind is not None else v
        raw = scalars  # numpy steps see scalar operands as Python values, as flex.binary does
        out_at = {}
        if kernel.reduce is None and outs is not None:
            for j, i in enumerate(kernel.outputs):
                if outs[j] is not None and i not in out_at:
                    out_at[i] = outs[j]
        for (kind_, i, payload), dead in zip(plan.steps, self._drops):
            if kind_ == "np":
                vals[i] = self._numpy_step(body[i], i, vals, raw)
            else:
                prog, leaf_ids = payload
                args = [vals[j] for j in leaf_ids]
                dest = out_at.get(i)
                if dest is not None and _direct_out_ok(dest, inputs, shape, _NP_OF_KIND[plan.kind[i]]):
                    prog(*args, out=dest, ex_uses_vml=False)
                    vals[i] = dest
                else:
                    vals[i] = prog(*args, ex_uses_vml=False)
                del args
            for j in dead:
                vals[j] = None
        results: list[Any] = []
        for j, i in enumerate(kernel.outputs):
            v, ins = vals[i], body[i]
            out = None if outs is None else outs[j]
            if ins.op == "scalar":
                v = be.full((), raw[ins.args[0]], ins.dtype)
            if kernel.reduce is not None:
                if tuple(v.shape) != tuple(shape):
                    v = be.expand(v, tuple(shape))
                v = be.reduce(kernel.reduce[0], v, kernel.reduce[1], True)
            elif out is None and (tuple(v.shape) != tuple(shape) or ins.op == "load"
                                  or any(v is r for r in results)):
                v = be.copy(be.expand(v, tuple(shape)))  # new memory, never an input's view or another output
            if out is not None and v is not out:
                be.assign(out, v)  # broadcasts a lower-rank value; copies into strided or aliased targets
                v = out
            results.append(v)
        return results

    def _numpy_step(self, ins: Instr, i: int, vals: list[Any], raw: Sequence[Any]) -> Any:
        """One instruction through the backend, with interpret()'s handling of scalar operands."""
        body = self.kernel.body

        def val(j: int) -> Any:  # a scalar operand is the Python value, as interpret passes it
            return raw[body[j].args[0]] if body[j].op == "scalar" else vals[j]

        return backend_step(self.backend, ins, body, val)


def _choose(t: dict[str, list[float]]) -> str:
    """The path to keep from the trials' best times: numpy, the reference, unless another path wins clearly (the
    first numexpr call may start threads and the first blocked call allocates: min() ignores them)."""
    best, best_time = "numpy", min(t["numpy"])
    if t["numexpr"] and min(t["numexpr"]) < NUMEXPR_MARGIN * best_time:
        best, best_time = "numexpr", min(t["numexpr"])
    if t["blocked"] and min(t["blocked"]) < BLOCKED_MARGIN * best_time:
        best = "blocked"
    return best


def _size_class(n: int, in_place: bool) -> int:
    """The key paths are timed and chosen by: log2 of the element count, and whether the call writes into given
    targets (the numpy path updates them in place; numexpr may need a copy), as those differ in cost."""
    return 2 * n.bit_length() + in_place


def _direct_out_ok(dest: Any, inputs: Sequence[Any], shape: tuple[int, ...], dtype: type) -> bool:
    """Whether numexpr may write straight into ``dest``: a C-contiguous aligned array of the iteration shape that
    overlaps no kernel input (numexpr may keep temporaries in the output block before it reads an aliased input,
    and later steps may still read the input)."""
    if type(dest) is not np.ndarray or not dest.flags.c_contiguous or not dest.flags.aligned:
        return False
    if dest.shape != tuple(shape) or dest.dtype != dtype or dest.dtype.byteorder not in "=|":
        return False
    return not any(type(a) is np.ndarray and np.may_share_memory(dest, a) for a in inputs)


def _numpy_runner(kernel: Kernel, backend: Any) -> Callable[..., list[Any]]:
    """The numpy path: the kernel op by op through the backend (the semantics of :func:`ember.ir.interpret`)."""

    def run(inputs: Sequence[Any], scalars: Sequence[Any], shape: tuple[int, ...],
            outs: Sequence[Any] | None = None) -> list[Any]:
        return interpret(kernel, backend, inputs, scalars, shape, outs)

    return run


_threads_synced = False


def _sync_threads(numexpr: Any) -> None:
    """Once, at the first fused kernel: numexpr's pool gets flex's thread count (``ember.set_num_threads``, else
    the CPUs this process may use), where numexpr would cap itself at 8 or 16 on its own. ``set_num_threads`` sets
    both pools later on; ``NUMEXPR_NUM_THREADS``/``OMP_NUM_THREADS`` in the environment keep numexpr's own choice."""
    global _threads_synced
    if _threads_synced:
        return
    _threads_synced = True
    import os

    if "NUMEXPR_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    from .threads import get_num_threads

    numexpr.set_num_threads(max(1, min(get_num_threads(), numexpr.MAX_THREADS)))


def compile_kernel(kernel: Kernel, backend: Any) -> FusedKernel | None:
    """flex's ``fusion_compile``: a :class:`FusedKernel`, or None where neither the blocked path (elementwise
    kernels) nor numexpr (an optional accelerator, where it computes some instruction exactly) applies: the kernel
    then runs op by op anyway, so fusing it would gain nothing."""
    plan: _NumexprPlan | None = None
    try:
        import numexpr
    except ImportError:
        pass
    else:
        _sync_threads(numexpr)
        try:
            plan = _NumexprPlan(kernel, backend)
        except _Unsupported:
            pass
    try:
        blocks: BlockPlan | None = BlockPlan(kernel, backend)
    except ValueError:  # a reduction, or no step the blocks would speed up
        blocks = None
    if plan is None and blocks is None:
        return None
    return FusedKernel(kernel, backend, plan, blocks)


def benchmark_gelu(n: int = 1_000_000, repeats: int = 20) -> dict[str, float]:
    """Median seconds of an 8-op GELU-like tanh chain, 0.5*x*(1+tanh(0.7978845608*(x+0.044715*x*x*x))), on ``n``
    float32 elements: fused (numexpr path, numpy path, measured choice) and flex op by op (``interpret``)."""
    from ember.ir import Instr as I  # noqa: N817

    from .backend import FlexBackend

    be = FlexBackend()
    f32 = dt.float32
    body = (I("load", (0,), f32), I("scalar", (0,), f32), I("scalar", (1,), f32), I("scalar", (2,), f32),
            I("scalar", (3,), f32),
            I("binary", ("mul", 0, 0), f32), I("binary", ("mul", 5, 0), f32),  # x*x*x
            I("binary", ("mul", 6, 3), f32), I("binary", ("add", 0, 7), f32),  # x + 0.044715*x^3
            I("binary", ("mul", 8, 2), f32), I("unary", ("tanh", 9), f32),  # tanh(0.79788*(...))
            I("binary", ("add", 10, 4), f32), I("binary", ("mul", 0, 11), f32),  # x * (1 + t)
            I("binary", ("mul", 12, 1), f32))  # * 0.5
    kernel = Kernel(1, (f32,), 4, body, (13,))
    fk = compile_kernel(kernel, be)
    assert fk is not None
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    sc, shape = (0.5, 0.7978845608, 0.044715, 1.0), (n,)

    def med(fn: Callable[[], Any]) -> float:
        fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    return {
        "op_by_op": med(lambda: interpret(kernel, be, [x], sc, shape)),
        "fused_numexpr": med(lambda: fk.run_path("numexpr", [x], sc, shape)),
        "fused_numpy": med(lambda: fk.run_path("numpy", [x], sc, shape)),
        "fused_auto": med(lambda: fk([x], sc, shape, [None])),
    }
