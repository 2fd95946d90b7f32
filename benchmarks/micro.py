"""Micro-benchmarks (issue 6), side by side and alternating: ember (flex, flex+autodiff) vs PyTorch CPU and numpy.

* per-op eager overhead: ``a * b`` and ``a + b`` on 1,000 float32 elements, with and without autodiff
* matmul GFLOP/s for 256/512/1024/2048 float32 squares, against numpy's own sgemm in the same run (% of numpy)
* conv2d forward, and forward+backward, at the seed CNN's second conv shape ((B, 64, 13, 13) * (64, 64, 3, 3))
* an 8-op GELU-like elementwise chain on 1M float32
* reductions (sum, mean, amax) over 1M float32
* exact GELU and layer_norm, forward and forward+backward
* the fused training kernels: cross-entropy at class indices, training batch norm, causal scaled-dot-product
  attention, forward and forward+backward
* copy bandwidth: GB/s of a 64 MB clone (bytes cloned per second)

Every figure is the median over >= 5 timed repetitions after warm-up, the frameworks rotating inside every repeat,
with min/max/IQR as spread and the ratio ember/PyTorch (of times: > 1 means ember is slower). Every timed call's
result is realized inside the timed loop (``_common.realize``: its device synced while the result is alive), so a
lazily recording device (ember-fusion) is timed computing, not recording ops whose results it then drops.

This module also holds the helpers the suite (``benchmarks/suite.py``) shares: :func:`measure`, :func:`figure`
and :func:`format_table`.

Usage::

    python benchmarks/micro.py [--quick] [--json PATH]
    ember bench micro [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench micro` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

import _common  # noqa: E402
from _common import PER_OP_HOLD, environment, stats, write_json  # noqa: E402

import ember  # noqa: E402
import ember.nn.functional as F  # noqa: E402
from ember import Device  # noqa: E402

EMBER = "ember flex"
EMBER_AD = "ember flex+autodiff"
TORCH = "torch cpu"
NUMPY = "numpy"
MIN_REPEATS = 5


def torch_module() -> Any:
    """torch, or None when it is not installed (it is a benchmark-only dependency)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


# ----------------------------------------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------------------------------------
def measure(cases: dict[str, Callable[[], Any]], repeats: int, number: int = 1, warmup: int = 1,
            realize_results: bool = True, hold: int = 1) -> dict[str, dict[str, float]]:
    """Seconds per call of every case: warm-up, then ``repeats`` samples of ``number`` calls each, rotating the
    order every repeat so drift (turbo, other load) hits every case alike. Returns stats per case.

    Every call's result is realized inside the timed loop (``_common.realize``: ember devices synced with the
    results alive), ``hold`` results per sync; ``realize_results=False`` times calls whose results are dropped
    (on a lazily recording device: the recording alone)."""
    repeats = max(repeats, MIN_REPEATS)
    samples = _common.sample_cases(cases, repeats, number, warmup, realize_results, hold)
    return {name: stats(s) for name, s in samples.items()}


def figure(section: str, name: str, unit: str, seconds: dict[str, dict[str, float]], work: float = 1.0,
           ember_case: str = EMBER, torch_case: str = TORCH, **extra: Any) -> dict[str, Any]:
    """One reported figure. ``unit`` is a time unit (``ms``, ``us``) or a rate (``samples/s``, ``GFLOP/s``,
    ``GB/s``: ``work`` units per second, ``work`` already scaled to the unit); ratio = ember time / torch time."""
    ratio = None
    if ember_case in seconds and torch_case in seconds:
        ratio = seconds[ember_case]["median"] / seconds[torch_case]["median"]
    return {"section": section, "name": name, "unit": unit, "work": work, "ember_case": ember_case,
            "torch_case": torch_case, "seconds": seconds, "ratio_ember_torch": ratio, **extra}


_TIME_SCALE = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _value(fig: dict[str, Any], seconds: float) -> float:
    unit = fig["unit"]
    if unit in _TIME_SCALE:
        return seconds * _TIME_SCALE[unit]
    return fig["work"] / seconds


def _cell(fig: dict[str, Any], case: str) -> tuple[str, str]:
    """(median, spread) text of one case; the spread is min..max and the IQR in the figure's unit."""
    s = fig["seconds"].get(case)
    if s is None:
        return "-", ""
    lo, hi = sorted((_value(fig, s["min"]), _value(fig, s["max"])))
    q = sorted((_value(fig, s["q1"]), _value(fig, s["q3"])))
    return f"{_value(fig, s['median']):.4g}", f"{lo:.3g}..{hi:.3g} iqr {q[1] - q[0]:.2g}"


def format_table(figures: list[dict[str, Any]]) -> str:
    """The terminal table: one row per figure, ember and PyTorch (and numpy where measured) side by side."""
    header = ["section", "benchmark", "unit", "ember", "ember spread", "torch", "torch spread", "ember/torch time",
              "other"]
    rows: list[list[str]] = []
    for fig in figures:
        em, em_sp = _cell(fig, fig["ember_case"])
        to, to_sp = _cell(fig, fig["torch_case"])
        ratio = "n/a" if fig["ratio_ember_torch"] is None else f"{fig['ratio_ember_torch']:.2f}x"
        other = []
        for case in fig["seconds"]:
            if case not in (fig["ember_case"], fig["torch_case"]):
                other.append(f"{case} {_cell(fig, case)[0]}")
        if fig.get("pct_of_numpy") is not None:
            other.append(f"ember = {fig['pct_of_numpy']:.0f}% of numpy")
        if fig.get("note"):
            other.append(fig["note"])
        rows.append([fig["section"], fig["name"], fig["unit"], em, em_sp, to, to_sp, ratio, "; ".join(other)])
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# micro-benchmarks
# ----------------------------------------------------------------------------------------------------------
def bench_per_op(repeats: int, number: int) -> list[dict[str, Any]]:
    """Per-op time of a*b and a+b on 1,000 float32, with and without autodiff (``a`` requires grad)."""
    import operator

    torch = torch_module()
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal(1000, dtype=np.float32), rng.standard_normal(1000, dtype=np.float32)
    flex, ad = Device.flex(), Device.flex().autodiff()
    a_f, b_f = ember.tensor(a_np, device=flex), ember.tensor(b_np, device=flex)
    a_ad, b_ad = ember.tensor(a_np, device=ad, requires_grad=True), ember.tensor(b_np, device=ad)
    out = []
    for sym, fn in (("*", operator.mul), ("+", operator.add)):
        if fn(a_ad, b_ad).grad_fn is None:  # the autodiff case must really record a node
            raise SystemExit("micro: ember flex+autodiff recorded no grad_fn")
        cases: dict[str, Callable[[], Any]] = {EMBER: partial(fn, a_f, b_f), EMBER_AD: partial(fn, a_ad, b_ad),
                                               NUMPY: partial(fn, a_np, b_np)}
        if torch is not None:
            a_t, b_t = torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy())
            cases[TORCH] = partial(fn, a_t, b_t)
            cases["torch requires_grad"] = partial(fn, a_t.clone().requires_grad_(), b_t)
        # one device sync per PER_OP_HOLD results: each op still computes (1k elements run eagerly on a fused
        # device), but the figure stays the op's own cost rather than the op plus a sync
        s = measure(cases, repeats, number, warmup=number // 10, hold=PER_OP_HOLD)
        plain = {k: s[k] for k in (EMBER, TORCH, NUMPY) if k in s}
        grad = {k: s[k] for k in (EMBER_AD, "torch requires_grad") if k in s}
        out.append(figure("per-op", f"a {sym} b, 1k f32", "us", plain))
        out.append(figure("per-op", f"a {sym} b, 1k f32, autodiff", "us", grad, ember_case=EMBER_AD,
                          torch_case="torch requires_grad"))
    return out


def bench_matmul(sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """float32 square matmul GFLOP/s; numpy's own sgemm in the same run is the practical peak."""
    torch = torch_module()
    dev = Device.flex()
    rng = np.random.default_rng(1)
    out = []
    for n in sizes:
        a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
        ea, eb = ember.tensor(a, device=dev), ember.tensor(b, device=dev)
        if not np.allclose((ea @ eb).numpy(), a @ b, rtol=1e-3, atol=1e-2):
            raise SystemExit(f"micro: ember matmul {n}x{n} disagrees with numpy")
        cases: dict[str, Callable[[], Any]] = {EMBER: partial(ember.matmul, ea, eb), NUMPY: partial(np.matmul, a, b)}
        if torch is not None:
            cases[TORCH] = partial(torch.matmul, torch.from_numpy(a), torch.from_numpy(b))
        number = max(1, int(2e8 // n**3))  # keep each sample >~ tens of ms at small sizes
        s = measure(cases, repeats, number)
        pct = 100.0 * s[NUMPY]["median"] / s[EMBER]["median"]
        out.append(figure("matmul", f"{n}x{n} f32", "GFLOP/s", s, work=2.0 * n**3 / 1e9, pct_of_numpy=pct))
    return out


def bench_conv(batch: int, repeats: int) -> list[dict[str, Any]]:
    """The seed CNN's second conv: (B, 64, 13, 13) * (64, 64, 3, 3) + bias; forward, and forward+backward."""
    torch = torch_module()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, 64, 13, 13), dtype=np.float32)
    w = (rng.standard_normal((64, 64, 3, 3), dtype=np.float32) / 24).astype(np.float32)
    bias = rng.standard_normal(64, dtype=np.float32)
    flex, ad = Device.flex(), Device.flex().autodiff()
    ex, ew, eb = (ember.tensor(v, device=flex) for v in (x, w, bias))
    axx = ember.tensor(x, device=ad, requires_grad=True)
    aw, ab = ember.tensor(w, device=ad, requires_grad=True), ember.tensor(bias, device=ad, requires_grad=True)

    def ember_fb() -> tuple[Any, ...]:
        F.conv2d(axx, aw, ab).sum().backward()
        return axx.grad, aw.grad, ab.grad  # what backward produced, realized by measure

    fwd: dict[str, Callable[[], Any]] = {EMBER: partial(F.conv2d, ex, ew, eb)}
    fb: dict[str, Callable[[], Any]] = {EMBER_AD: ember_fb}
    if torch is not None:
        tF = torch.nn.functional
        tx, tw, tb = (torch.from_numpy(v.copy()) for v in (x, w, bias))
        gx, gw, gb = (t.clone().requires_grad_() for t in (tx, tw, tb))
        ref = tF.conv2d(tx, tw, tb).numpy()
        if not np.allclose(F.conv2d(ex, ew, eb).numpy(), ref, rtol=1e-3, atol=1e-3):
            raise SystemExit("micro: ember conv2d disagrees with torch")

        def torch_fwd() -> Any:
            with torch.no_grad():
                return tF.conv2d(tx, tw, tb)

        def torch_fb() -> tuple[Any, ...]:
            tF.conv2d(gx, gw, gb).sum().backward()
            return gx.grad, gw.grad, gb.grad

        fwd[TORCH], fb[TORCH] = torch_fwd, torch_fb
    shape = f"({batch},64,13,13)*(64,64,3,3)"
    return [figure("conv2d", f"forward {shape}", "ms", measure(fwd, repeats, 1, warmup=2)),
            figure("conv2d", f"fwd+bwd {shape}", "ms", measure(fb, repeats, 1, warmup=2), ember_case=EMBER_AD)]


def _gelu_chain(x: Any, tanh: Callable[[Any], Any]) -> Any:
    """8 elementwise ops: x*x, *x, *0.044715, +x, *sqrt(2/pi), tanh, +1, *x (GELU without the final 0.5)."""
    t = x * x
    t = t * x
    t = t * 0.044715
    t = t + x
    t = t * 0.7978845608
    t = tanh(t)
    t = t + 1.0
    return t * x


def bench_elementwise_and_reductions(n: int, repeats: int) -> list[dict[str, Any]]:
    """The 8-op chain, and sum / mean / amax over ``n`` float32."""
    torch = torch_module()
    x = np.random.default_rng(3).standard_normal(n, dtype=np.float32)
    ex = ember.tensor(x, device=Device.flex())
    if not np.allclose(_gelu_chain(ex, ember.tanh).numpy(), _gelu_chain(x, np.tanh), rtol=1e-4, atol=1e-5):
        raise SystemExit("micro: ember elementwise chain disagrees with numpy")
    tx = torch.from_numpy(x.copy()) if torch is not None else None
    chain: dict[str, Callable[[], Any]] = {EMBER: partial(_gelu_chain, ex, ember.tanh),
                                           NUMPY: partial(_gelu_chain, x, np.tanh)}
    if tx is not None:
        chain[TORCH] = partial(_gelu_chain, tx, torch.tanh)
    out = [figure("elementwise", f"8-op GELU-like chain, {n // 10**6}M f32", "ms", measure(chain, repeats, 3))]
    for op in ("sum", "mean", "amax"):
        cases: dict[str, Callable[[], Any]] = {EMBER: getattr(ex, op), NUMPY: getattr(x, {"amax": "max"}.get(op, op))}
        if tx is not None:
            cases[TORCH] = getattr(tx, op)
        out.append(figure("reduction", f"{op} over {n // 10**6}M f32", "ms", measure(cases, repeats, 5)))
    return out


def bench_gelu_layer_norm(rows: int, repeats: int) -> list[dict[str, Any]]:
    """Exact GELU and layer_norm (with weight and bias) over (rows, 512) float32 -- a transformer's feed-forward and
    residual activations -- forward on ``Device.flex()`` and forward+backward on its autodiff device; each is one
    extension op per direction on flex (``ember.ops.train_kernels``)."""
    torch = torch_module()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((rows, 512), dtype=np.float32)
    w = rng.uniform(0.5, 1.5, 512).astype(np.float32)
    bias = rng.standard_normal(512, dtype=np.float32)
    flex, ad = Device.flex(), Device.flex().autodiff()
    ex, ew, eb = (ember.tensor(v, device=flex) for v in (x, w, bias))
    gx, gw, gb = (ember.tensor(v, device=ad, requires_grad=True) for v in (x, w, bias))

    def ember_gelu_fb() -> Any:
        F.gelu(gx).sum().backward()
        return gx.grad

    def ember_ln_fb() -> tuple[Any, ...]:
        F.layer_norm(gx, (512,), gw, gb).sum().backward()
        return gx.grad, gw.grad, gb.grad

    cases = {"gelu fwd": {EMBER: partial(F.gelu, ex)}, "gelu fwd+bwd": {EMBER_AD: ember_gelu_fb},
             "layer_norm fwd": {EMBER: partial(F.layer_norm, ex, (512,), ew, eb)},
             "layer_norm fwd+bwd": {EMBER_AD: ember_ln_fb}}
    if torch is not None:
        tF = torch.nn.functional
        tx, tw, tb = (torch.from_numpy(v.copy()) for v in (x, w, bias))
        rx, rw, rb = (t.clone().requires_grad_() for t in (tx, tw, tb))
        pairs = ((F.gelu(ex), tF.gelu(tx)), (F.layer_norm(ex, (512,), ew, eb), tF.layer_norm(tx, (512,), tw, tb)))
        for ours, ref in pairs:
            if not np.allclose(ours.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5):
                raise SystemExit("micro: ember gelu/layer_norm disagrees with torch")

        def torch_gelu_fb() -> Any:
            tF.gelu(rx).sum().backward()
            return rx.grad

        def torch_ln_fb() -> tuple[Any, ...]:
            tF.layer_norm(rx, (512,), rw, rb).sum().backward()
            return rx.grad, rw.grad, rb.grad

        def no_grad(fn: Callable[..., Any], *args: Any) -> Any:
            with torch.no_grad():
                return fn(*args)

        cases["gelu fwd"][TORCH] = partial(no_grad, tF.gelu, tx)
        cases["gelu fwd+bwd"][TORCH] = torch_gelu_fb
        cases["layer_norm fwd"][TORCH] = partial(no_grad, tF.layer_norm, tx, (512,), tw, tb)
        cases["layer_norm fwd+bwd"][TORCH] = torch_ln_fb
    out = []
    for name, c in cases.items():
        ember_case = EMBER_AD if EMBER_AD in c else EMBER
        out.append(figure("gelu/layer_norm", f"{name} ({rows},512) f32", "ms", measure(c, repeats, 1, warmup=2),
                          ember_case=ember_case))
    return out


def bench_train_kernels(rows: int, bn_batch: int, att_batch: int, repeats: int) -> list[dict[str, Any]]:
    """The fused training kernels and attention against torch, each one op per direction on flex
    (``ember.ops.train_kernels``, ``ember.ops.attention``): cross-entropy over (rows, 1000) float32 logits at class
    indices, training-mode batch norm over (bn_batch, 64, 28, 28) with weight and bias (the seed CNN's first
    block), and scaled-dot-product attention over (att_batch, 8, 128, 64) (causal) -- forward on ``Device.flex()``
    (batch norm: forward on the autodiff device, since it updates running stats either way), forward+backward on
    its autodiff device."""
    torch = torch_module()
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((rows, 1000), dtype=np.float32)
    target = rng.integers(0, 1000, rows)
    xb = rng.standard_normal((bn_batch, 64, 28, 28), dtype=np.float32)
    w, bias = rng.uniform(0.5, 1.5, 64).astype(np.float32), rng.standard_normal(64, dtype=np.float32)
    q, k, v = (rng.standard_normal((att_batch, 8, 128, 64), dtype=np.float32) for _ in range(3))
    flex, ad = Device.flex(), Device.flex().autodiff()
    el, et = ember.tensor(logits, device=flex), ember.tensor(target, device=flex)
    gl, gt = ember.tensor(logits, device=ad, requires_grad=True), ember.tensor(target, device=ad)
    gx, gw, gb = (ember.tensor(a, device=ad, requires_grad=True) for a in (xb, w, bias))
    rm, rv = ember.zeros(64, device=ad), ember.ones(64, device=ad)
    eq, ek, ev = (ember.tensor(a, device=flex) for a in (q, k, v))
    aq, ak, av = (ember.tensor(a, device=ad, requires_grad=True) for a in (q, k, v))

    def ember_ce_fb() -> Any:
        F.cross_entropy(gl, gt).backward()
        return gl.grad

    def ember_bn_f() -> Any:
        with ember.no_grad():
            return F.batch_norm(gx, rm, rv, gw, gb, training=True)

    def ember_bn_fb() -> tuple[Any, ...]:
        F.batch_norm(gx, rm, rv, gw, gb, training=True).sum().backward()
        return gx.grad, gw.grad, gb.grad

    def ember_att_fb() -> tuple[Any, ...]:
        F.scaled_dot_product_attention(aq, ak, av, is_causal=True).sum().backward()
        return aq.grad, ak.grad, av.grad

    cases: dict[str, dict[str, Callable[[], Any]]] = {
        f"cross_entropy fwd ({rows},1000)": {EMBER: partial(F.cross_entropy, el, et)},
        f"cross_entropy fwd+bwd ({rows},1000)": {EMBER_AD: ember_ce_fb},
        f"batch_norm train fwd ({bn_batch},64,28,28)": {EMBER_AD: ember_bn_f},
        f"batch_norm train fwd+bwd ({bn_batch},64,28,28)": {EMBER_AD: ember_bn_fb},
        f"sdpa causal fwd ({att_batch},8,128,64)": {EMBER: partial(F.scaled_dot_product_attention, eq, ek, ev,
                                                                   is_causal=True)},
        f"sdpa causal fwd+bwd ({att_batch},8,128,64)": {EMBER_AD: ember_att_fb},
    }
    if torch is not None:
        tF = torch.nn.functional
        tl, tt = torch.from_numpy(logits.copy()), torch.from_numpy(target.copy())
        rl = tl.clone().requires_grad_()
        tx, tw, tb = (torch.from_numpy(a.copy()).requires_grad_() for a in (xb, w, bias))
        trm, trv = torch.zeros(64), torch.ones(64)
        tq, tk, tv = (torch.from_numpy(a.copy()) for a in (q, k, v))
        rq, rk, rv_ = (t.clone().requires_grad_() for t in (tq, tk, tv))
        checks = ((F.cross_entropy(el, et), tF.cross_entropy(tl, tt)),
                  (F.scaled_dot_product_attention(eq, ek, ev, is_causal=True),
                   tF.scaled_dot_product_attention(tq, tk, tv, is_causal=True)))
        for ours, ref in checks:
            if not np.allclose(ours.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5):
                raise SystemExit("micro: ember cross_entropy/attention disagrees with torch")

        def no_grad(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
            with torch.no_grad():
                return fn(*args, **kw)

        def torch_ce_fb() -> Any:
            tF.cross_entropy(rl, tt).backward()
            return rl.grad

        def torch_bn_fb() -> tuple[Any, ...]:
            tF.batch_norm(tx, trm, trv, tw, tb, training=True).sum().backward()
            return tx.grad, tw.grad, tb.grad

        def torch_att_fb() -> tuple[Any, ...]:
            tF.scaled_dot_product_attention(rq, rk, rv_, is_causal=True).sum().backward()
            return rq.grad, rk.grad, rv_.grad

        torch_cases = [partial(no_grad, tF.cross_entropy, tl, tt), torch_ce_fb,
                       partial(no_grad, tF.batch_norm, tx, trm, trv, tw, tb, training=True), torch_bn_fb,
                       partial(no_grad, tF.scaled_dot_product_attention, tq, tk, tv, is_causal=True), torch_att_fb]
        for c, fn in zip(cases.values(), torch_cases):
            c[TORCH] = fn
    out = []
    for name, c in cases.items():
        ember_case = EMBER_AD if EMBER_AD in c else EMBER
        out.append(figure("train kernels", f"{name} f32", "ms", measure(c, repeats, 1, warmup=2),
                          ember_case=ember_case))
    return out


def bench_copy(megabytes: int, repeats: int) -> list[dict[str, Any]]:
    """GB/s of cloning a ``megabytes`` MB float32 tensor (bytes cloned per second; read + write is twice that)."""
    torch = torch_module()
    n = megabytes * 2**20 // 4
    x = np.random.default_rng(4).standard_normal(n, dtype=np.float32)
    ex = ember.tensor(x, device=Device.flex())
    cases: dict[str, Callable[[], Any]] = {EMBER: ex.clone, NUMPY: x.copy}
    if torch is not None:
        cases[TORCH] = torch.from_numpy(x.copy()).clone
    return [figure("copy", f"clone {megabytes} MB", "GB/s", measure(cases, repeats, 2), work=n * 4 / 1e9)]


def run(quick: bool) -> list[dict[str, Any]]:
    """Every micro-benchmark; ``quick`` shrinks sizes and loop counts (still >= 5 repeats each)."""
    if quick:
        figs = bench_per_op(5, 300)
        figs += bench_matmul((256, 512), 5)
        figs += bench_conv(16, 5)
        figs += bench_elementwise_and_reductions(10**6, 5)
        figs += bench_gelu_layer_norm(256, 5)
        figs += bench_train_kernels(256, 8, 2, 5)
        figs += bench_copy(16, 5)
    else:
        figs = bench_per_op(9, 10000)
        figs += bench_matmul((256, 512, 1024, 2048), 7)
        figs += bench_conv(64, 7)
        figs += bench_elementwise_and_reductions(10**6, 9)
        figs += bench_gelu_layer_norm(2048, 9)
        figs += bench_train_kernels(2048, 64, 8, 9)
        figs += bench_copy(64, 9)
    return figs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ember micro-benchmarks vs PyTorch and numpy")
    parser.add_argument("--quick", action="store_true", help="small sizes, few loops (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="write results and environment to PATH")
    args = parser.parse_args(argv)
    figs = run(args.quick)
    print(format_table(figs))
    if args.json:
        write_json(args.json, {"benchmark": "micro", "quick": args.quick, "figures": figs,
                               "environment": environment()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
