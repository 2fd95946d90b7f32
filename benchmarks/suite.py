"""The full benchmark suite (issue 6): what plain ``ember bench`` runs.

Side by side and alternating in one run -- ember on ``Device.flex()`` (inference, micro-benchmarks) and
``Device.flex().autodiff()`` (training) against PyTorch CPU when torch is installed -- each figure the median over
>= 5 timed repetitions after warm-up, with spread (min/max/IQR) and the ratio ember/PyTorch of times (> 1: ember
is slower):

* seed-CNN training step (forward, cross-entropy, backward, Adam lr 1e-3) at batch 64 and 256
* seed text-transformer training step (AdamW lr 1e-3) in the ``small`` configuration (2 layers, d 128, seq 128,
  batch 8) and the ``full`` one (6 layers, d 512, ff 2048, 8 heads, seq 512, vocab 28996, batch 2)
* each training step twice: eager, and through ``ember.compile`` (recorded once, then replayed: how
  ``ember_train.Learner`` runs it by default); the eager, compiled and torch steps alternate in one timing loop
* inference throughput (samples/s, eval mode under no_grad) of both models
* the micro-benchmarks of ``benchmarks/micro.py``
* peak memory of one training step per model: peak RSS growth in a fresh process, ember and torch
* speedups of ember's own decorators, from ``benchmarks/compile.py`` and ``benchmarks/fusion.py``: the seed-CNN
  step replayed (``ember.compile``) vs eager, fused vs unfused (fusion named), and the GELU chain fused vs unfused,
  on flex and on OpenCL when a device is present (``--quick``: flex only, small batches)

At the end, the target table (``benchmarks/targets.py``) reads the targets of the speed work off these figures: each
figure's value, its target and whether it is met.

Both frameworks start from the same weights (ember's initialisation, copied into the torch twin by name). Every
timed call ends with its work done: a training step reads its loss and syncs the device, inference reads the logits
(``.numpy()``), and the micro-benchmarks realize each result (``_common.realize``) inside the timed loop.

Usage::

    ember bench [--quick] [--json PATH] [--only SECTION ...]
    python benchmarks/suite.py [--quick] [--json PATH] [--only SECTION ...]

``--quick`` (CI smoke, well under a minute) shrinks batches, skips the full transformer and runs the smaller
micro-benchmarks; CI never asserts timings. Sections: cnn, transformer, inference, micro, memory, speedups; and,
only when asked for with ``--only ports``, the train-step times of the PyTorch ports (``benchmarks/ports.py``:
torch, ember fused and ember unfused per program of ``examples/ports/``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `ember bench` loads this file by path: make its siblings importable
    sys.path.insert(0, str(HERE))

import micro  # noqa: E402
import targets  # noqa: E402
import transformer  # noqa: E402
from _common import (  # noqa: E402
    bench_parser,
    describe_environment,
    environment,
    peak_rss_growth,
    run_rss_probe,
    write_json,
)
from micro import EMBER, EMBER_AD, TORCH, figure, format_table, measure, torch_module  # noqa: E402

#: the training step through ember.compile (recorded once, replayed after), on flex+autodiff
EMBER_COMPILED = "ember flex+autodiff compiled"
from models import seed_cnn_batch  # noqa: E402

import ember  # noqa: E402
import ember.nn.functional as F  # noqa: E402
from ember import Device  # noqa: E402
from ember_train.models import SeedCNN, text_transformer  # noqa: E402

SECTIONS = ("cnn", "transformer", "inference", "micro", "memory", "speedups")
#: sections that run only when named with --only (plain `ember bench` keeps its running time)
OPTIONAL_SECTIONS = ("ports",)
MODELS = ("cnn", "transformer-small", "transformer-full")


# ----------------------------------------------------------------------------------------------------------
# models, weights and batches
# ----------------------------------------------------------------------------------------------------------
def _new_model(model: str) -> Any:
    return SeedCNN() if model == "cnn" else text_transformer(model.split("-", 1)[1], transformer.NUM_CLASSES)


_INIT: dict[str, dict[str, np.ndarray]] = {}


def _init_state(model: str) -> dict[str, np.ndarray]:
    """One set of initial weights per model (ember's init on flex's seeded stream), shared by every case."""
    if model not in _INIT:
        Device.flex().seed(0)
        _INIT[model] = {k: v.detach().numpy().copy() for k, v in _new_model(model).state_dict().items()}
    return _INIT[model]


def ember_model(model: str, device: Device) -> Any:
    m = _new_model(model)
    m.load_state_dict({k: ember.tensor(v) for k, v in _init_state(model).items()})
    return m.to(device)


def torch_model(model: str) -> Any:
    import torch
    from models import torch_seed_cnn

    m = torch_seed_cnn() if model == "cnn" else transformer.torch_text_transformer(model.split("-", 1)[1])
    state = m.state_dict()
    with torch.no_grad():
        for k, v in _init_state(model).items():
            state[k].copy_(torch.from_numpy(v))
    return m


def batch_numpy(model: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    return seed_cnn_batch(batch) if model == "cnn" else transformer.token_batch(model.split("-", 1)[1], batch)


def _optimizers(model: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(ember, torch) optimizer factories: Adam for the CNN, AdamW for the transformer; lr 1e-3."""
    torch = torch_module()
    if model == "cnn":
        return (lambda p: ember.optim.Adam(p, lr=1e-3)), (lambda p: torch.optim.Adam(p, lr=1e-3))
    return (lambda p: ember.optim.AdamW(p, lr=1e-3)), (lambda p: torch.optim.AdamW(p, lr=1e-3))


def ember_train_step(model: str, batch: int, dev: Device | None = None, compiled: bool = False) -> Callable[[], float]:
    """One training step of ``model`` (Adam for the CNN, AdamW for the transformer, lr 1e-3) on ``dev``, an
    autodiff device (flex+autodiff by default), eager or through ``ember.compile`` (the Learner's default); the
    model is the step's ``model`` attribute."""
    dev = dev if dev is not None else Device.flex().autodiff()
    m = ember_model(model, dev)
    m.train()
    opt = _optimizers(model)[0](m.parameters())
    x_np, y_np = batch_numpy(model, batch)
    x, y = ember.tensor(x_np, device=dev), ember.tensor(y_np, device=dev)

    def body(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss

    run = ember.compile(body) if compiled else body

    def step() -> float:
        value = float(run(x, y).item())  # reading the loss realizes it
        dev.sync()  # and whatever else the step left pending (none today: its in-place updates run at once)
        return value

    step.model = m  # type: ignore[attr-defined]
    step.compiled = run if compiled else None  # type: ignore[attr-defined]  # its stats() count replays
    return step


def torch_train_step(model: str, batch: int) -> Callable[[], float]:
    torch = torch_module()
    m = torch_model(model)
    m.train()
    opt = _optimizers(model)[1](m.parameters())
    x_np, y_np = batch_numpy(model, batch)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


# ----------------------------------------------------------------------------------------------------------
# sections
# ----------------------------------------------------------------------------------------------------------
def bench_train(model: str, batch: int, repeats: int, warmup: int) -> list[dict[str, Any]]:
    """Two figures from one alternating run: the eager step and the compiled (replayed) step, each against torch."""
    compiled = ember_train_step(model, batch, compiled=True)
    cases: dict[str, Callable[[], Any]] = {EMBER_AD: ember_train_step(model, batch), EMBER_COMPILED: compiled}
    if torch_module() is not None:
        cases[TORCH] = torch_train_step(model, batch)
    opt = "Adam" if model == "cnn" else "AdamW"
    section = "cnn" if model == "cnn" else "transformer"
    seconds = measure(cases, repeats, 1, max(warmup, 2))  # the compiled step records on its first calls
    name = f"{model} train step, batch {batch} ({opt})"
    speedup = seconds[EMBER_AD]["median"] / seconds[EMBER_COMPILED]["median"]
    return [figure(section, name, "ms", seconds, ember_case=EMBER_AD),
            figure(section, f"{name}, ember.compile", "ms", seconds, ember_case=EMBER_COMPILED,
                   replay_speedup=speedup, note=f"replayed {speedup:.2f}x eager's speed")]


def bench_inference(model: str, batch: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Samples/s of eval-mode forward passes under no_grad; checks ember's logits against torch's first."""
    x_np, _ = batch_numpy(model, batch)
    m = ember_model(model, Device.flex())
    m.eval()
    x = ember.tensor(x_np, device=Device.flex())

    def ember_fwd() -> Any:
        with ember.no_grad():
            return m(x).numpy()

    cases: dict[str, Callable[[], Any]] = {EMBER: ember_fwd}
    note = ""
    torch = torch_module()
    if torch is not None:
        tm = torch_model(model)
        tm.eval()
        tx = torch.from_numpy(x_np)

        def torch_fwd() -> Any:
            with torch.no_grad():
                return tm(tx).numpy()

        ref = torch_fwd()
        err = float(np.max(np.abs(ember_fwd() - ref)) / max(float(np.max(np.abs(ref))), 1e-12))
        note = f"logits rel. err vs torch {err:.1e}"
        if err > 1e-3:  # timing two models that compute different things would be meaningless
            raise SystemExit(f"suite: ember {model} inference disagrees with torch (relative error {err:.2g})")
        cases[TORCH] = torch_fwd
    section = "inference"
    return figure(section, f"{model} eval forward, batch {batch}", "samples/s", measure(cases, repeats, 1, warmup),
                  work=float(batch), note=note)


def rss_probe(model: str, framework: str, batch: int) -> dict[str, int]:
    """In a fresh process: peak RSS growth of one training step at ``batch``, after a warm-up step at batch 1 (it
    loads code and thread pools). The warm-up's model, optimizer state and batch stay alive while the step is
    measured: freed, their memory would stay with the allocator and the measured step would reuse it instead of
    growing (the small transformer's step then showed 0.1 MiB of growth)."""
    make = torch_train_step if framework == "torch" else ember_train_step
    warm_up = make(model, 1)
    warm_up()
    growth = peak_rss_growth(make(model, batch))
    del warm_up  # alive until here
    return growth


def bench_memory(model: str, batch: int) -> dict[str, Any]:
    """Peak RSS growth of one training step, ember and torch, each in its own interpreter."""
    frameworks = ["ember"] + (["torch"] if torch_module() is not None else [])
    out: dict[str, int | None] = {}
    for fw in frameworks:
        out[fw] = run_rss_probe(str(Path(__file__).resolve()), [model, fw, str(batch)],
                                f"suite: RSS probe {model}/{fw}")
    em, to = out.get("ember"), out.get("torch")
    return {"section": "memory", "name": f"{model} train step, batch {batch}, peak RSS growth", "unit": "MiB",
            "bytes": out, "ratio_ember_torch": em / to if em is not None and to else None}


def _mib(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.1f}"


def format_memory(mem: list[dict[str, Any]]) -> str:
    lines = ["Peak memory of one training step (peak RSS growth in a fresh process, MiB)"]
    for m in mem:
        em, to = m["bytes"].get("ember"), m["bytes"].get("torch")
        ratio = "n/a" if m["ratio_ember_torch"] is None else f"{m['ratio_ember_torch']:.2f}x"
        lines.append(f"  {m['name']:<58} ember {_mib(em):>8}  torch {_mib(to):>8}  ember/torch {ratio}")
    return "\n".join(lines)


def bench_speedups(quick: bool) -> list[dict[str, Any]]:
    """ember against itself: replayed vs eager step (compile.py), fused vs unfused step and GELU chain (fusion.py),
    on flex and, unless ``quick``, on OpenCL when a device is present; each figure re-sectioned for the table."""
    # siblings that import this module: imported here, when the section runs
    import compile as replay_bench
    import fusion as fusion_bench
    from opencl import opencl_device

    ocl = None if quick else opencl_device()[0]
    names = ["flex"] + (["opencl"] if ocl is not None else [])
    devices = [("flex", Device.flex().autodiff())] + ([("opencl", ocl.autodiff())] if ocl is not None else [])
    repeats = 5 if quick else 7
    figs = [{**f, "section": "replay"}
            for f in replay_bench.bench_train(devices, (8,) if quick else (16, 64), repeats)]
    figs += [{**f, "section": "fused step"}
             for f in fusion_bench.bench_train("cnn", 8 if quick else 64, names, repeats, 2 if quick else 5)]
    figs += [{**f, "section": "fused chain"}
             for f in fusion_bench.bench_gelu(10**6, names, repeats, 2 if quick else 5)]
    return figs


# ----------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------
def plan(quick: bool) -> dict[str, Any]:
    """Sizes and repeat counts (>= 5 timed repeats everywhere; quick only shrinks batches and skips full)."""
    if quick:
        return {"cnn": [16], "transformer": [("transformer-small", 4)], "repeats": 5, "warmup": 1,
                "inference": [("cnn", 64), ("transformer-small", 8)],
                "memory": [("cnn", 16), ("transformer-small", 4)]}
    return {"cnn": [64, 256], "transformer": [("transformer-small", 8), ("transformer-full", 2)], "repeats": 7,
            "warmup": 2, "inference": [("cnn", 256), ("transformer-small", 16), ("transformer-full", 2)],
            "memory": [("cnn", 64), ("transformer-small", 8), ("transformer-full", 2)]}


def run(quick: bool, only: Sequence[str] = ()) -> dict[str, Any]:
    p = plan(quick)
    sections = [s for s in SECTIONS if not only or s in only] + [s for s in OPTIONAL_SECTIONS if s in only]
    figures: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    for section in sections:
        t0 = time.perf_counter()
        if section == "cnn":
            figures += [f for b in p["cnn"] for f in bench_train("cnn", b, p["repeats"], p["warmup"])]
        elif section == "transformer":
            figures += [f for m, b in p["transformer"] for f in bench_train(m, b, p["repeats"], 1)]
        elif section == "inference":
            figures += [bench_inference(m, b, p["repeats"], p["warmup"]) for m, b in p["inference"]]
        elif section == "micro":
            figures += micro.run(quick)
        elif section == "memory":
            memory += [bench_memory(m, b) for m, b in p["memory"]]
        elif section == "speedups":
            figures += bench_speedups(quick)
        elif section == "ports":
            import ports  # a sibling script; imported here so plain `ember bench` does not load the ports

            figures += ports.run(quick)
        for fig in figures:  # what reproduces the row: this section alone, at the same sizes
            fig.setdefault("command", f"ember bench{' --quick' if quick else ''} --only {section}")
        timings[section] = time.perf_counter() - t0
        print(f"[{section}: {timings[section]:.1f} s]", file=sys.stderr, flush=True)
    return {"benchmark": "suite", "quick": quick, "sections": sections, "figures": figures, "memory": memory,
            "section_seconds": timings}


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("ember benchmark suite: models, micro-benchmarks and memory vs PyTorch",
                          "small batches, no full transformer (CI smoke)", SECTIONS + OPTIONAL_SECTIONS,
                          flag="--only")
    parser.add_argument("--rss-probe", nargs=3, metavar=("MODEL", "FRAMEWORK", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_probe:
        model, fw, batch = args.rss_probe
        print(json.dumps(rss_probe(model, fw, int(batch))))
        return 0

    env = environment()
    print(describe_environment(env))
    print("times: median of >= 5 alternating repeats after warm-up; spread = min..max and IQR; "
          "ember/torch = ratio of median times (> 1: ember slower)\n")
    result = run(args.quick, args.only or ())
    if result["figures"]:
        print(format_table(result["figures"]))
        commands = dict.fromkeys(f"{f['section']}: {f['command']}" for f in result["figures"])
        print("\nreproduce a row (its section alone):\n  " + "\n  ".join(commands))
    if result["memory"]:
        print("\n" + format_memory(result["memory"]))
    result["targets"] = targets.evaluate(result["figures"], result["memory"])
    print("\n" + targets.format_targets(result["targets"]))
    if args.json:
        result["environment"] = env
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
