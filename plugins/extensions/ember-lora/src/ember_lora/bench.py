"""``ember bench lora``: the measured figures of fine-tuning and quantization, side by side in one run.

Sections:

* ``finetune``: one AdamW training step of the seed transformer (``ember_train.models``, the ``full`` configuration
  by default: 6 pre-norm layers of width 512, vocabulary 28,996, sequences of 512) three ways -- every weight, LoRA
  (``r=8``, ``lora_alpha=16``, ``"all-linear"``, the head as ``modules_to_save``) and QLoRA (the same adapters on an
  NF4 base with double quantization). Each method runs in a fresh interpreter, so the process's peak RSS (VmHWM)
  and the device pool's peak (``memory_report()["peak"]``, which the contract cannot reset) belong to that method
  alone. Reported: trainable-parameter fraction, weights as stored, peak RSS of the process and its growth over the
  first step (forward, backward, optimizer step with its new state), the pool's peak, and the median step time
  over the following steps (each realized: the loss is read and the device synced before the clock stops).
* ``nf4``: reconstruction RMSE of NF4 / FP4 (block 64, with and without double quantization) on N(0, 1) 4096x4096.
* ``matmul``: QLoRA's base product ``x @ dequant(Wq).T`` two ways on ``--device`` (``opencl`` for ember-lora's
  kernels): the ``quant.matmul_4bit`` op (on OpenCL one kernel that dequantizes each weight tile in local memory)
  and dequantize-then-matmul (``quant.dequantize_4bit`` into a float weight, then the device's matmul). Each way
  runs in a fresh interpreter for its pool peak (the op's bytes above what was in use before it); the times are
  medians of interleaved repeats in one more process, so both ways see the same machine load.
* ``ptq``: int8 post-training dynamic quantization (:func:`ember.quantization.quantize_dynamic`) of the seed CNN
  (trained briefly on the digits training split) and of the seed transformer's small configuration (trained briefly
  on ``synthetic_sequences``): validation accuracy float vs int8 and the weights' bytes.

``python -m ember_lora.bench --json out.json`` or ``ember bench lora`` (entry-point group ``ember.benchmarks``);
``--quick`` shrinks everything to a smoke test (the small transformer, fewer steps, a smaller NF4 matrix).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

import ember
from ember import nn
from ember.errors import ValueRangeError

from .config import LoraConfig
from .model import apply_lora, trainable_parameters
from .qlora import apply_qlora

__all__ = ["main", "finetune_step", "nf4_rmse", "ptq_accuracy", "matmul_probe", "matmul_times"]

SECTIONS = ("finetune", "nf4", "matmul", "ptq")
#: the 4-bit matmul shapes (rows of x, out_features, in_features): the full seed transformer's feed-forward layer
#: for a batch of 2 x 512 tokens, and a 4096 x 4096 weight for a few rows (decoding) and for 256 rows
MATMUL_SHAPES = ((1024, 2048, 512), (16, 4096, 4096), (256, 4096, 4096))
MATMUL_WAYS = ("kernel", "dequantize+matmul")
METHODS = ("full", "lora", "qlora")
_MiB = 1024 * 1024


# ----------------------------------------------------------------------------------------------------------
# process memory (Linux /proc; None elsewhere)
# ----------------------------------------------------------------------------------------------------------
def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec, and only VmHWM can be reset
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _pool(device: ember.Device, key: str) -> int | None:
    try:
        value = device.memory_report().get(key)
    except ember.EmberError:
        return None
    return None if value is None else int(value)


def _realize(device: ember.Device, loss: ember.Tensor) -> float:
    """Finish the step's work with the loss alive: read it and sync the device (a lazily recording or queued
    device would otherwise be timed while still working)."""
    value = float(loss.item())
    device.sync()
    return value


# ----------------------------------------------------------------------------------------------------------
# finetune: one method in this process
# ----------------------------------------------------------------------------------------------------------
def finetune_step(method: str, config: str = "full", batch: int = 2, steps: int = 3, device: str = "flex",
                  seed: int = 0) -> dict[str, Any]:
    """Figures of one fine-tuning method on the seed transformer in this process (run it in a fresh interpreter:
    the process's and the pool's peaks are only that method's there)."""
    from ember_train.models import TRANSFORMER_CONFIGS, text_transformer

    if method not in METHODS:
        raise ValueRangeError(f"finetune_step: method must be one of {METHODS}, got {method!r}")
    dev = ember.device(device).autodiff()
    cfg = TRANSFORMER_CONFIGS[config]
    ember.manual_seed(seed, dev)
    model = text_transformer(config, num_classes=4).to(dev)
    if method != "full":
        lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", modules_to_save=["head"])
        (apply_lora if method == "lora" else apply_qlora)(model, lora)
    trainable, total = trainable_parameters(model)
    weights = sum(t.numel() * t.dtype.itemsize for t in model.state_dict().values())
    rng = np.random.default_rng(seed)
    x = ember.tensor(rng.integers(0, cfg.vocab_size, (batch, cfg.max_len)).astype(np.int64), device=dev)
    y = ember.tensor(rng.integers(0, 4, batch).astype(np.int64), device=dev)
    opt = ember.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    model.train()

    def step() -> float:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return _realize(dev, loss)

    dev.sync()
    rss_ok = _reset_peak_rss()
    rss_before = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    step()  # the first step: gradients and the optimizer's state come into being here
    first_s = time.perf_counter() - t0
    rss_peak = _status_bytes("VmHWM")
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {
        "method": method, "config": config, "batch": batch, "device": str(dev),
        "trainable": trainable, "total": total, "trainable_fraction": trainable / total,
        "weights_bytes": weights,
        "peak_rss_bytes": rss_peak if rss_ok else None,
        "step_rss_growth_bytes": (max(rss_peak - rss_before, 0)
                                  if rss_ok and rss_peak is not None and rss_before is not None else None),
        "pool_peak_bytes": _pool(dev, "peak"),
        "pool_in_use_bytes": _pool(dev, "in_use"),
        "first_step_ms": 1000 * first_s,
        "step_ms_median": 1000 * statistics.median(times) if times else None,
        "step_ms_samples": [1000 * t for t in times],
    }


def _finetune_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for method in METHODS:
        cmd = [sys.executable, "-m", "ember_lora.bench", "--probe", method, "--config", args.config,
               "--batch", str(args.batch), "--steps", str(args.steps), "--device", args.device]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ember bench lora: the {method} probe failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        _print_finetune(rows[-1:], header=len(rows) == 1)
    return rows


def _mib(v: int | None) -> str:
    return "n/a" if v is None else f"{v / _MiB:,.1f}"


def _print_finetune(rows: list[dict[str, Any]], header: bool) -> None:
    if header:
        print(f"{'method':<7}{'trainable':>13}{'trainable %':>13}{'weights MiB':>13}{'peak RSS MiB':>14}"
              f"{'step RSS +MiB':>15}{'pool peak MiB':>15}{'step ms (median)':>18}")
    for r in rows:
        step = "n/a" if r["step_ms_median"] is None else f"{r['step_ms_median']:,.0f}"
        print(f"{r['method']:<7}{r['trainable']:>13,d}{r['trainable_fraction']:>13.2%}{_mib(r['weights_bytes']):>13}"
              f"{_mib(r['peak_rss_bytes']):>14}{_mib(r['step_rss_growth_bytes']):>15}"
              f"{_mib(r['pool_peak_bytes']):>15}{step:>18}", flush=True)


# ----------------------------------------------------------------------------------------------------------
# nf4 / fp4 reconstruction error
# ----------------------------------------------------------------------------------------------------------
def nf4_rmse(n: int = 4096, device: str = "flex", seed: int = 0) -> list[dict[str, Any]]:
    """RMSE of quantize-then-dequantize on N(0, 1) ``n x n`` float32 (block 64) for NF4 and FP4, with and without
    double quantization of the absmax."""
    from ember import quantization as Q

    w = np.random.default_rng(seed).standard_normal((n, n), dtype=np.float32)
    t = ember.tensor(w, device=ember.device(device))
    out = []
    for fmt in ("nf4", "fp4"):
        for dq in (False, True):
            q = Q.quantize(t, fmt, blocksize=64, double_quant=dq)
            back = q.dequantize().numpy()
            rmse = float(np.sqrt(np.mean((back.astype(np.float64) - w) ** 2)))
            out.append({"format": fmt, "double_quant": dq, "shape": [n, n], "rmse": rmse,
                        "bytes_per_weight": q.nbytes() / (n * n)})
            print(f"{fmt} block 64{' + double quant' if dq else '':<16} RMSE {rmse:.4f}  "
                  f"{q.nbytes() / (n * n):.4f} bytes/weight", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------
# the 4-bit matmul: kernel vs dequantize-then-matmul
# ----------------------------------------------------------------------------------------------------------
def _matmul_operands(rows: int, out_f: int, in_f: int, dev: ember.Device, seed: int = 0) -> tuple[Any, ...]:
    """x, packed codes and absmax on ``dev`` (quantized on flex and copied, so setting up costs the device only
    the 4-bit weight)."""
    from ember import quantization as Q

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out_f, in_f), dtype=np.float32)
    q = Q.quantize(ember.tensor(w), "nf4", blocksize=64)
    x = ember.tensor(rng.standard_normal((rows, in_f), dtype=np.float32), device=dev)
    return x, q.data.to(dev), q.absmax().to(dev)


def _matmul_way(way: str, x: Any, packed: Any, absmax: Any, out_f: int, in_f: int) -> ember.Tensor:
    from ember.quantization import ops as qops

    if way == "kernel":
        return qops.matmul_4bit(x, packed, absmax, None, out_features=out_f, in_features=in_f, blocksize=64,
                                quant_type="nf4")
    w = qops.dequantize_4bit(packed, absmax, blocksize=64, quant_type="nf4")
    return x @ w[:out_f * in_f].reshape(out_f, in_f).T


def matmul_probe(way: str, rows: int, out_f: int, in_f: int, device: str = "opencl") -> dict[str, Any]:
    """Pool bytes of one ``way`` product in this process (run it in a fresh interpreter: the pool's peak cannot be
    reset): ``peak`` after the product minus ``in_use`` before it."""
    if way not in MATMUL_WAYS:
        raise ValueRangeError(f"matmul_probe: way must be one of {MATMUL_WAYS}, got {way!r}")
    dev = ember.device(device)
    x, packed, absmax = _matmul_operands(rows, out_f, in_f, dev)
    dev.sync()
    setup_peak, before = _pool(dev, "peak"), _pool(dev, "in_use")
    out = _matmul_way(way, x, packed, absmax, out_f, in_f)
    out.numpy()
    dev.sync()
    peak = _pool(dev, "peak")
    above = None if peak is None or before is None or setup_peak is None or peak <= setup_peak else peak - before
    return {"way": way, "shape": [rows, out_f, in_f], "device": str(dev), "pool_peak_above_bytes": above,
            "pool_in_use_before_bytes": before, "output_bytes": rows * out_f * 4,
            "float_weight_bytes": out_f * in_f * 4}


def matmul_times(rows: int, out_f: int, in_f: int, device: str = "opencl", repeats: int = 5) -> dict[str, Any]:
    """Median milliseconds of each way (interleaved repeats after a warm-up; each result read back) and the largest
    difference between their outputs."""
    dev = ember.device(device)
    x, packed, absmax = _matmul_operands(rows, out_f, in_f, dev)
    outs = {way: _matmul_way(way, x, packed, absmax, out_f, in_f).numpy() for way in MATMUL_WAYS}  # warm-up
    samples: dict[str, list[float]] = {way: [] for way in MATMUL_WAYS}
    for _ in range(repeats):
        for way in MATMUL_WAYS:
            t0 = time.perf_counter()
            _matmul_way(way, x, packed, absmax, out_f, in_f).numpy()
            samples[way].append(1000 * (time.perf_counter() - t0))
    diff = float(np.abs(outs["kernel"].astype(np.float64) - outs["dequantize+matmul"]).max())
    return {"shape": [rows, out_f, in_f], "device": str(dev), "max_abs_diff": diff,
            **{f"{way}_ms_median": statistics.median(v) for way, v in samples.items()},
            **{f"{way}_ms_samples": v for way, v in samples.items()}}


def _matmul_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    shapes = ((64, 512, 256), (16, 1024, 1024)) if args.quick else MATMUL_SHAPES
    rows = []
    print(f"{'x rows':>7}{'W (out x in)':>14}{'kernel ms':>11}{'deq+mm ms':>11}{'kernel pool MiB':>17}"
          f"{'deq+mm pool MiB':>17}{'float W MiB':>13}{'max |diff|':>12}")
    for shape in shapes:
        row: dict[str, Any] = {}
        for way in MATMUL_WAYS:
            cmd = [sys.executable, "-m", "ember_lora.bench", "--matmul-probe", way, *map(str, shape),
                   "--device", args.device]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"ember bench lora: the {way} matmul probe failed:\n{proc.stderr[-3000:]}")
            row[way] = json.loads(proc.stdout.strip().splitlines()[-1])
        cmd = [sys.executable, "-m", "ember_lora.bench", "--matmul-times", *map(str, shape), "--device", args.device,
               "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ember bench lora: the matmul timing failed:\n{proc.stderr[-3000:]}")
        row["times"] = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        t = row["times"]
        print(f"{shape[0]:>7}{f'{shape[1]} x {shape[2]}':>14}{t['kernel_ms_median']:>11,.1f}"
              f"{t['dequantize+matmul_ms_median']:>11,.1f}{_mib(row['kernel']['pool_peak_above_bytes']):>17}"
              f"{_mib(row['dequantize+matmul']['pool_peak_above_bytes']):>17}"
              f"{_mib(row['kernel']['float_weight_bytes']):>13}{t['max_abs_diff']:>12.2e}", flush=True)
    return rows


# ----------------------------------------------------------------------------------------------------------
# int8 post-training quantization
# ----------------------------------------------------------------------------------------------------------
def _train(model: nn.Module, x: np.ndarray, y: np.ndarray, dev: ember.Device, epochs: int, batch: int, lr: float,
           seed: int) -> None:
    opt = ember.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed)
    model.train()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for i in range(0, len(y), batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            loss = loss_fn(model(ember.tensor(x[idx], device=dev)), ember.tensor(y[idx], device=dev))
            loss.backward()
            opt.step()
    model.eval()


def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, dev: ember.Device) -> float:
    hits = 0
    with ember.no_grad():
        for i in range(0, len(y), 256):
            logits = model(ember.tensor(x[i:i + 256], device=dev)).numpy()
            hits += int((logits.argmax(-1) == y[i:i + 256]).sum())
    return hits / len(y)


def ptq_accuracy(quick: bool = False, device: str = "flex", seed: int = 0) -> list[dict[str, Any]]:
    """Validation accuracy of the seed CNN (digits) and the small seed transformer (synthetic sequences), float32
    vs int8 dynamic quantization (``quantize_dynamic``: the Linear layers; for the CNN also Linear and Conv2d),
    with the weights' bytes before and after."""
    from ember import quantization as Q
    from ember_train.datasets import digits, synthetic_sequences
    from ember_train.models import SeedCNN, text_transformer

    dev = ember.device(device).autodiff()
    out = []
    ember.manual_seed(seed, dev)
    train, valid = digits("train"), digits("valid")
    cnn = SeedCNN().to(dev)
    _train(cnn, *train.arrays, dev, epochs=1 if quick else 3, batch=64, lr=1e-3, seed=seed)
    n_seq, seq_len, vocab = (400, 16, 64) if quick else (2000, 32, 128)
    seqs = synthetic_sequences(n_seq, seq_len, vocab, 4, seed)
    sx, sy = seqs.arrays
    k = int(0.8 * n_seq)
    ember.manual_seed(seed, dev)
    tf = text_transformer("small", num_classes=4, vocab_size=vocab, max_len=seq_len).to(dev)
    _train(tf, sx[:k], sy[:k], dev, epochs=2 if quick else 4, batch=32, lr=1e-3, seed=seed)
    cases = (("seed CNN (digits)", cnn, valid.arrays, {nn.Linear}),
             ("seed CNN (digits)", cnn, valid.arrays, {nn.Linear, nn.Conv2d}),
             ("seed transformer small (synthetic)", tf, (sx[k:], sy[k:]), {nn.Linear}))
    for name, model, (vx, vy), spec in cases:
        acc_f = _accuracy(model, vx, vy, dev)
        size_f = Q.model_size(model)["weights_bytes"]
        qmodel = Q.quantize_dynamic(model, spec, inplace=False)
        acc_q = _accuracy(qmodel, vx, vy, dev)
        size_q = Q.model_size(qmodel)["weights_bytes"]
        layers = sorted({type(m).__name__ for _, m in Q.quantized_modules(qmodel)})
        out.append({"model": name, "float_accuracy": acc_f, "int8_accuracy": acc_q,
                    "delta_points": 100 * (acc_q - acc_f), "float_bytes": size_f, "int8_bytes": size_q,
                    "quantized_layers": layers, "valid_size": len(vy)})
        print(f"{name:<36} float {acc_f:.2%}  int8 {acc_q:.2%}  delta {100 * (acc_q - acc_f):+.2f} points  "
              f"weights {size_f:,d} -> {size_q:,d} bytes ({', '.join(layers)})", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember bench lora", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: the small transformer, 1 timed step, NF4 on "
                                                        "1024x1024, short PTQ training")
    p.add_argument("--json", metavar="PATH", help="write the results and the environment to PATH")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), metavar="SECTION",
                   help=f"run only these sections ({', '.join(SECTIONS)})")
    p.add_argument("--device", default="flex", help="ember device (default flex)")
    p.add_argument("--config", default=None, choices=("full", "small"),
                   help="seed transformer configuration for finetune (default full; small with --quick)")
    p.add_argument("--batch", type=int, default=2, help="finetune batch size (default 2, as `ember bench`)")
    p.add_argument("--steps", type=int, default=None, help="timed steps after the first (default 3; 1 with --quick)")
    p.add_argument("--probe", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--matmul-probe", nargs=4, metavar=("WAY", "ROWS", "OUT", "IN"), help=argparse.SUPPRESS)
    p.add_argument("--matmul-times", nargs=3, type=int, metavar=("ROWS", "OUT", "IN"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections and print their tables (``--json PATH`` also writes them)."""
    args = _parser().parse_args(argv)
    args.config = args.config or ("small" if args.quick else "full")
    args.steps = args.steps if args.steps is not None else (1 if args.quick else 3)
    if args.probe:
        print(json.dumps(finetune_step(args.probe, args.config, args.batch, args.steps, args.device)))
        return 0
    if args.matmul_probe:
        way, *dims = args.matmul_probe
        print(json.dumps(matmul_probe(way, *map(int, dims), device=args.device)))
        return 0
    if args.matmul_times:
        print(json.dumps(matmul_times(*args.matmul_times, device=args.device, repeats=max(args.steps, 1))))
        return 0
    print(f"ember {ember.__version__}, ember-lora on {args.device}; {platform.processor() or platform.machine()} "
          f"({os.cpu_count()} CPUs), numpy {np.__version__}")
    result: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k not in ("probe", "json")}}
    if "finetune" in args.sections:
        print(f"\n== one AdamW step of the seed transformer ({args.config}), batch {args.batch}, "
              f"{args.steps} timed steps; each method in a fresh process ==")
        result["finetune"] = _finetune_all(args)
    if "nf4" in args.sections:
        n = 1024 if args.quick else 4096
        print(f"\n== 4-bit reconstruction error on N(0, 1) {n}x{n} ==")
        result["nf4"] = nf4_rmse(n, args.device)
    if "matmul" in args.sections:
        print(f"\n== NF4 matmul x @ dequant(W).T on {args.device}: the quant.matmul_4bit kernel vs dequantize then "
              f"matmul; pool bytes above the operands, each way in a fresh process; median of {args.steps} "
              "interleaved repeats ==")
        result["matmul"] = _matmul_all(args)
    if "ptq" in args.sections:
        print("\n== int8 dynamic quantization (post-training) ==")
        result["ptq"] = ptq_accuracy(args.quick, args.device)
    if args.json:
        result["environment"] = {"python": platform.python_version(), "numpy": np.__version__,
                                 "ember": ember.__version__, "cpu_count": os.cpu_count(),
                                 "platform": platform.platform()}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
