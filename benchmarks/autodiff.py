"""Autodiff benchmark (issue 3): per-op recording overhead, the seed-CNN training step, and its peak memory.

Measures, in one run and side by side with PyTorch (CPU):

1. **Per-op overhead** of recording a gradient node: ``a * b`` and ``a + b`` on 1,000 float32 elements where
   ``a`` requires grad, forward only. Cases: ember on ``Device.flex()`` (no autodiff), ember on
   ``Device.flex().autodiff()``, torch without and with ``requires_grad``. Timed alternately inside every repeat;
   results are kept alive and realized (ember's device synced) every 64 calls inside the timed loop; per-op time
   is the median over repeats (min/max and IQR as spread). The overhead is the difference autodiff minus plain,
   for each framework. Also the forward and backward of a small chain, ``(a * b + a).sum().backward()`` with both
   operands requiring grad, ember on flex+autodiff against torch.
2. **Seed-CNN training step** (docs/models.md: forward, cross-entropy, backward, Adam lr 1e-3) on
   flex+autodiff (with and without balanced checkpointing) and on PyTorch, same architecture, same initial weights,
   same batch; median of the steps after warm-up, alternating frameworks; each timed step ends with its device
   synced while the loss is alive, so nothing it recorded is left uncomputed.
3. **Peak memory** of one training step with and without ``checkpointing="balanced"``: tracemalloc (which traces
   numpy's buffers) for ember -- the memory held after the forward pass (what the graph saved for backward) and
   the peak over the whole step -- and, in fresh subprocesses, the peak RSS growth of one step for ember and
   torch (torch's allocations are not visible to tracemalloc). It also checks that the gradients of the two
   checkpointing modes are bitwise identical, and that ember's gradients agree with torch's (dropout off).

Usage::

    python benchmarks/autodiff.py                  # full run: batch 64 and 256 (1-2 minutes)
    python benchmarks/autodiff.py --quick          # CI smoke (batch 8, 1-2 repeats; about 15 s)
    python benchmarks/autodiff.py --json out.json  # also write results + environment
    ember bench autodiff [--quick] [--json PATH]   # the same, through the CLI
"""

from __future__ import annotations

import argparse
import gc
import json
import operator
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench autodiff` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

import _common  # noqa: E402
import models  # noqa: E402 - needs the path above
from _common import PER_OP_HOLD, environment, peak_rss_growth, run_rss_probe, stats, write_json  # noqa: E402

import ember  # noqa: E402
from ember import Device  # noqa: E402

N_ELEMENTS = 1000
MODES = {"none": None, "balanced": "balanced"}


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _device(mode: str) -> Device:
    ckpt = MODES[mode]
    return Device.flex().autodiff() if ckpt is None else Device.flex().autodiff(checkpointing=ckpt)


# ----------------------------------------------------------------------------------------------------------
# 1. per-op overhead
# ----------------------------------------------------------------------------------------------------------
def bench_per_op(repeats: int, number: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per-op seconds of a*b and a+b for every case, and of the small chain's forward+backward (key ``CHAIN``);
    {op: {case: stats}}."""
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal(N_ELEMENTS, dtype=np.float32)
    b_np = rng.standard_normal(N_ELEMENTS, dtype=np.float32)
    flex, ad = Device.flex(), Device.flex().autodiff()
    a_f, b_f = ember.tensor(a_np, device=flex), ember.tensor(b_np, device=flex)
    a_ad, b_ad = ember.tensor(a_np, device=ad, requires_grad=True), ember.tensor(b_np, device=ad)
    torch = _torch()
    if torch is not None:
        a_t, b_t = torch.from_numpy(a_np.copy()), torch.from_numpy(b_np.copy())
        a_tg = torch.from_numpy(a_np.copy()).requires_grad_()
    result: dict[str, dict[str, dict[str, float]]] = {}
    for op, sym, fn in (("mul", "*", operator.mul), ("add", "+", operator.add)):
        # check that what we time computes the right thing -- and records a node -- before timing it
        y = fn(a_ad, b_ad)
        if not np.array_equal(y.detach().numpy(), fn(a_np, b_np)) or y.grad_fn is None:
            raise SystemExit(f"autodiff bench: ember a {sym} b on flex+autodiff is wrong or recorded no node")
        # partial(operator.mul, a, b) costs the same for every case and less than a lambda
        cases: dict[str, Callable[[], Any]] = {
            "ember flex": partial(fn, a_f, b_f),
            "ember flex+autodiff": partial(fn, a_ad, b_ad),
        }
        if torch is not None:
            if fn(a_tg, b_t).grad_fn is None:
                raise SystemExit("autodiff bench: torch recorded no grad_fn")
            cases["torch"] = partial(fn, a_t, b_t)
            cases["torch requires_grad"] = partial(fn, a_tg, b_t)
        # warm-up (caches, lazy imports, allocator pools), then alternating repeats; results are kept alive and
        # realized (ember's devices synced) every PER_OP_HOLD calls inside the timed loop
        samples = _common.sample_cases(cases, repeats, number, max(number // 10, 10), hold=PER_OP_HOLD)
        result[op] = {name: stats(s) for name, s in samples.items()}
    result[CHAIN] = _bench_chain(a_np, b_np, repeats, max(number // 10, 10))
    return result


#: the key of bench_per_op's small-chain figure: forward and backward of y = (a * b + a).sum()
CHAIN = "chain"


def _chain_step(a: Any, b: Any) -> Any:
    """Record y = (a * b + a).sum() and run its backward (the same code for ember and torch tensors); returns
    a's accumulated gradient, so the timing loop realizes what the step computed."""
    (a * b + a).sum().backward()
    return a.grad


def _bench_chain(a_np: np.ndarray, b_np: np.ndarray, repeats: int, number: int) -> dict[str, dict[str, float]]:
    """Seconds per forward+backward of a three-op chain on 1,000 float32, a and b requiring grad: the recording,
    the backward sweep, the vjps and the leaves' gradient accumulation, ember on flex+autodiff against torch."""
    ad = Device.flex().autodiff()
    a, b = ember.tensor(a_np, device=ad, requires_grad=True), ember.tensor(b_np, device=ad, requires_grad=True)
    _chain_step(a, b)
    # check what we time computes the right gradients before timing it
    if not (np.allclose(a.grad.numpy(), b_np + 1) and np.allclose(b.grad.numpy(), a_np)):
        raise SystemExit("autodiff bench: ember's gradients of (a * b + a).sum() are wrong")
    cases: dict[str, Callable[[], Any]] = {"ember flex+autodiff": partial(_chain_step, a, b)}
    torch = _torch()
    if torch is not None:
        at = torch.from_numpy(a_np.copy()).requires_grad_()
        bt = torch.from_numpy(b_np.copy()).requires_grad_()
        cases["torch requires_grad"] = partial(_chain_step, at, bt)
    samples = _common.sample_cases(cases, repeats, number, max(number // 10, 10))
    return {name: stats(s) for name, s in samples.items()}


# ----------------------------------------------------------------------------------------------------------
# 2. seed-CNN training step
# ----------------------------------------------------------------------------------------------------------
def _init_arrays() -> dict[str, np.ndarray]:
    """One set of initial weights (PyTorch-default init on flex's seeded stream), shared by every case."""
    dev = Device.flex()
    dev.seed(0)
    return models.SeedCnn(dev).state_numpy()


def _ember_case(mode: str, init: dict[str, np.ndarray], batch: int, dropout: float = models.DROPOUT
                ) -> tuple[models.SeedCnn, models.Adam, Any, Any]:
    dev = _device(mode)
    model = models.SeedCnn(dev, dropout=dropout)
    model.load_numpy(init)
    x_np, y_np = models.seed_cnn_batch(batch)
    return model, models.Adam(model.parameters(), lr=1e-3), ember.tensor(x_np, device=dev), ember.tensor(
        y_np, device=dev)


def _torch_case(init: dict[str, np.ndarray], batch: int, dropout: float = models.DROPOUT) -> tuple[Any, ...]:
    torch = _torch()
    model = models.torch_seed_cnn(dropout)
    models.load_torch(model, init)
    model.train()
    x_np, y_np = models.seed_cnn_batch(batch)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), torch.from_numpy(x_np), torch.from_numpy(y_np)


def bench_train_step(batch: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Seconds per training step for ember (both checkpointing modes) and torch; medians over repeats."""
    init = _init_arrays()
    steps: dict[str, Callable[[], Any]] = {}
    for mode in MODES:
        m, o, x, y = _ember_case(mode, init, batch)
        steps[f"ember flex+autodiff ({mode})"] = (lambda m=m, o=o, x=x, y=y: models.train_step(m, o, x, y))
    if _torch() is not None:
        tm, to, tx, ty = _torch_case(init, batch)
        steps["torch"] = lambda: models.torch_train_step(tm, to, tx, ty)

    # each timed step ends realized: the loss is alive when its device syncs, which runs everything still pending
    # in the thread (loss, batch-norm statistics, ...); the parameters' in-place updates ran inside the step
    samples = _common.sample_cases(steps, repeats, 1, warmup)
    return {"batch": batch, "repeats": repeats, "warmup": warmup,
            "seconds_per_step": {name: stats(s) for name, s in samples.items()}}


# ----------------------------------------------------------------------------------------------------------
# 3. memory and gradient equality
# ----------------------------------------------------------------------------------------------------------
def ember_memory(mode: str, batch: int) -> dict[str, int]:
    """tracemalloc bytes of one ember training step (after a warm-up step): held after forward, step peak."""
    model, opt, x, y = _ember_case(mode, _init_arrays(), batch)
    models.train_step(model, opt, x, y)  # warm-up: Adam state, lazy imports, caches
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        opt.zero_grad()
        loss = ember.nn.functional.cross_entropy(model(x), y)
        gc.collect()  # free what only cycles hold, so "after forward" is what the graph really keeps
        after_forward = tracemalloc.get_traced_memory()[0]
        loss.backward()
        opt.step()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {"after_forward_bytes": after_forward, "step_peak_bytes": peak}


def _grads(mode: str, init: dict[str, np.ndarray], batch: int, dropout: float) -> dict[str, np.ndarray]:
    model, _, x, y = _ember_case(mode, init, batch, dropout)
    x.device.seed(1234)  # same dropout masks in both modes (the stream is shared by every decoration of flex)
    ember.nn.functional.cross_entropy(model(x), y).backward()
    return {name: p.grad.numpy().copy() for name, p in model.params.items()}


def check_gradients(batch: int) -> dict[str, Any]:
    """Bitwise equality of the gradients with and without balanced checkpointing; agreement with torch."""
    init = _init_arrays()
    plain = _grads("none", init, batch, models.DROPOUT)
    balanced = _grads("balanced", init, batch, models.DROPOUT)
    identical = all(np.array_equal(plain[k], balanced[k]) for k in plain)
    max_diff = max(float(np.max(np.abs(plain[k] - balanced[k]))) for k in plain)
    out: dict[str, Any] = {"identical": identical, "max_abs_diff": max_diff, "vs_torch_max_rel_err": None}
    torch = _torch()
    if torch is not None:  # dropout off: masks come from different random streams
        ours = _grads("none", init, batch, 0.0)
        model, _, x, y = _torch_case(init, batch, 0.0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        theirs = {n: p.grad.numpy() for n, p in model.named_parameters()}
        # relative to the largest gradient of all: per-tensor ratios blow up on gradients that are ~0 by
        # construction (a conv bias followed by batch norm gets only rounding noise, in torch too)
        scale = max(float(np.max(np.abs(t))) for t in theirs.values())
        out["vs_torch_max_rel_err"] = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in ours) / scale
    return out


def _rss_probe(framework: str, mode: str, batch: int) -> dict[str, int]:
    """In a fresh process: peak RSS growth over one step at ``batch``, after a warm-up step at batch 2 (which
    loads code and thread pools but leaves little memory cached in the allocator)."""
    init = _init_arrays()
    if framework == "torch":
        models.torch_train_step(*_torch_case(init, 2))
        model, opt, x, y = _torch_case(init, batch)
        step: Callable[[], Any] = lambda: models.torch_train_step(model, opt, x, y)  # noqa: E731
    else:
        models.train_step(*_ember_case(mode, init, 2))
        em, eo, ex, ey = _ember_case(mode, init, batch)
        step = lambda: models.train_step(em, eo, ex, ey)  # noqa: E731
    return peak_rss_growth(step)


def rss_deltas(batch: int) -> dict[str, int | None]:
    """Peak RSS growth of one step per case, each in its own interpreter (None where unavailable)."""
    cases = [("ember", m) for m in MODES] + ([("torch", "none")] if _torch() is not None else [])
    out: dict[str, int | None] = {}
    for fw, mode in cases:
        name = "torch" if fw == "torch" else f"ember flex+autodiff ({mode})"
        out[name] = run_rss_probe(str(Path(__file__).resolve()), [fw, mode, str(batch)],
                                  f"autodiff bench: RSS probe {name}")
    return out


# ----------------------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------------------
def _us(x: float) -> str:
    return f"{x * 1e6:8.2f}"


def _mb(x: int | None) -> str:
    return "     n/a" if x is None else f"{x / 2**20:8.1f}"


def _overheads(per_op: dict[str, dict[str, float]]) -> dict[str, float | None]:
    em = per_op["ember flex+autodiff"]["median"] - per_op["ember flex"]["median"]
    res: dict[str, float | None] = {"ember": em, "torch": None, "ratio_overhead_ember_torch": None,
                                    "ratio_autodiff_ember_torch": None}
    if "torch" in per_op:
        tt = per_op["torch requires_grad"]["median"] - per_op["torch"]["median"]
        res["torch"] = tt
        res["ratio_overhead_ember_torch"] = em / tt if tt > 0 else None
        res["ratio_autodiff_ember_torch"] = (per_op["ember flex+autodiff"]["median"]
                                             / per_op["torch requires_grad"]["median"])
    return res


def report(per_op: dict[str, Any], steps: list[dict[str, Any]], memory: dict[str, Any], repeats: int,
           number: int) -> str:
    lines = [f"Per-op time, {N_ELEMENTS} float32 elements, forward only, `a` requires grad (microseconds; median of "
             f"{repeats} alternating repeats x {number} calls)"]
    for op, sym in (("mul", "*"), ("add", "+")):
        lines.append(f"  y = a {sym} b")
        lines.append(f"    {'case':<22}{'median':>9}{'min':>9}{'max':>9}{'IQR':>9}")
        for name, s in per_op[op].items():
            lines.append(f"    {name:<22}{_us(s['median'])} {_us(s['min'])} {_us(s['max'])} {_us(s['iqr'])}")
        ov = _overheads(per_op[op])
        line = f"    autodiff overhead: ember {ov['ember'] * 1e6:.2f} us"
        if ov["torch"] is not None:
            line += f", torch {ov['torch'] * 1e6:.2f} us"
            if ov["ratio_overhead_ember_torch"] is not None:
                line += f" (ratio {ov['ratio_overhead_ember_torch']:.2f}x)"
            line += f"; ember/torch with autodiff: {ov['ratio_autodiff_ember_torch']:.2f}x"
        lines.append(line)
    chain = per_op[CHAIN]
    lines += ["", "Forward + backward of y = (a * b + a).sum(), a and b require grad (microseconds; median of "
                  f"{repeats} alternating repeats x {max(number // 10, 10)} calls)",
              f"    {'case':<22}{'median':>9}{'min':>9}{'max':>9}{'IQR':>9}"]
    for name, s in chain.items():
        lines.append(f"    {name:<22}{_us(s['median'])} {_us(s['min'])} {_us(s['max'])} {_us(s['iqr'])}")
    if "torch requires_grad" in chain:
        ratio = chain["ember flex+autodiff"]["median"] / chain["torch requires_grad"]["median"]
        lines.append(f"    ember/torch: {ratio:.2f}x")
    for st in steps:
        lines += ["", f"Seed-CNN training step, batch {st['batch']}, Adam lr 1e-3 (milliseconds; median of "
                      f"{st['repeats']} alternating steps after {st['warmup']} warm-up)",
                  f"  {'case':<32}{'median':>9}{'min':>9}{'max':>9}{'IQR':>9}"]
        sps = st["seconds_per_step"]
        for name, s in sps.items():
            lines.append(f"  {name:<32}{s['median'] * 1e3:9.1f}{s['min'] * 1e3:9.1f}{s['max'] * 1e3:9.1f}"
                         f"{s['iqr'] * 1e3:9.1f}")
        if "torch" in sps:
            for mode in MODES:
                name = f"ember flex+autodiff ({mode})"
                lines.append(f"  ratio {name}/torch: {sps[name]['median'] / sps['torch']['median']:.2f}x")
        else:
            lines.append("  ratio ember/torch: n/a (PyTorch not installed)")
    b = memory["batch"]
    lines += ["", f"Peak memory of one training step, batch {b} (MiB)",
              f"  {'case':<32}{'after fwd':>10}{'step peak':>10}{'RSS delta':>10}"]
    for mode in MODES:
        name = f"ember flex+autodiff ({mode})"
        tm = memory["tracemalloc"][mode]
        lines.append(f"  {name:<32}{_mb(tm['after_forward_bytes']):>10}{_mb(tm['step_peak_bytes']):>10}"
                     f"{_mb(memory['rss'].get(name)):>10}")
    if "torch" in memory["rss"]:
        lines.append(f"  {'torch':<32}{'-':>10}{'-':>10}{_mb(memory['rss']['torch']):>10}")
    lines.append("  after fwd / step peak: tracemalloc (numpy buffers + Python objects); RSS delta: peak resident-set "
                 "growth of the step in a fresh process (torch is not visible to tracemalloc)")
    tm = memory["tracemalloc"]
    held = tm["balanced"]["after_forward_bytes"] / max(tm["none"]["after_forward_bytes"], 1)
    peak = tm["balanced"]["step_peak_bytes"] / max(tm["none"]["step_peak_bytes"], 1)
    lines.append(f"  balanced/none: held after forward {held:.2f}x, step peak {peak:.2f}x")
    g = memory["gradients"]
    lines.append(f"  gradients identical with and without checkpointing: {'yes' if g['identical'] else 'no'}"
                 + ("" if g["identical"] else f" (max abs diff {g['max_abs_diff']:.3g})"))
    if g["vs_torch_max_rel_err"] is not None:
        lines.append(f"  ember vs torch gradients (dropout off): max abs error / largest gradient "
                     f"{g['vs_torch_max_rel_err']:.2g}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ember autodiff: per-op overhead, seed-CNN step time and memory")
    parser.add_argument("--quick", action="store_true", help="tiny batch, 1-2 repeats (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="write results and environment to PATH")
    parser.add_argument("--batch", type=int, action="append", help="training-step batch size (repeatable; "
                        "default 64 and 256, or 8 with --quick)")
    parser.add_argument("--rss-probe", nargs=3, metavar=("FRAMEWORK", "MODE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_probe:
        fw, mode, batch = args.rss_probe
        print(json.dumps(_rss_probe(fw, mode, int(batch))))
        return 0

    if args.quick:
        repeats, number, step_repeats, warmup, batches = 3, 500, 2, 1, args.batch or [8]
    else:
        repeats, number, step_repeats, warmup, batches = 9, 10000, 7, 2, args.batch or [64, 256]
    mem_batch = batches[0]

    per_op = bench_per_op(repeats, number)
    steps = [bench_train_step(b, step_repeats, warmup) for b in batches]
    memory = {
        "batch": mem_batch,
        "tracemalloc": {mode: ember_memory(mode, mem_batch) for mode in MODES},
        "rss": rss_deltas(mem_batch),
        "gradients": check_gradients(mem_batch),
    }
    print(report(per_op, steps, memory, repeats, number))

    if args.json:
        result = {
            "benchmark": "autodiff",
            "quick": args.quick,
            "elements": N_ELEMENTS,
            "repeats": repeats,
            "number": number,
            "per_op_seconds": per_op,
            "per_op_overhead_seconds": {op: _overheads(v) for op, v in per_op.items() if op != CHAIN},
            "train_step": steps,
            "memory": memory,
            "environment": environment(),
        }
        write_json(args.json, result)
    # gradients that differ between checkpointing modes are a bug, not a measurement: fail loudly
    return 0 if memory["gradients"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
