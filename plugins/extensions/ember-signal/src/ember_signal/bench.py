"""``ember bench signal``: ember.fft / ember.stft / MelSpectrogram (ember-signal on flex) against torch on the same
inputs, in the same run.

Each row times one function on one size: ember's forward on flex, torch's forward (CPU), and forward+backward of a
``|f(x)|^2``-style loss under ember's autodiff and torch autograd. Times are the median of ``--repeat`` loops sized
to take about ``--min-time`` seconds each; every ember result is read back (``.numpy()``) inside the loop, so the work
is done, not just recorded. ``--json PATH`` writes the rows; ``--quick`` runs small sizes (the tests use it). The
script ships inside the package, so it runs from an installed wheel too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

SIZES_FULL = [(8, 4096), (1, 65536), (16, 16000)]
SIZES_QUICK = [(2, 512)]


def _mel(lib: Any) -> Callable[[Any], Any]:
    """A MelSpectrogram(n_fft=512, hop 128, 64 mels) of the library's kind (torchaudio's formulas in torch)."""
    if lib.__name__ == "ember":
        import ember

        mods: dict[Any, Any] = {}  # one module per device (its buffers live there)

        def mel_ember(x: Any) -> Any:
            if x.device not in mods:
                mods[x.device] = ember.signal.MelSpectrogram(sample_rate=16000, n_fft=512, hop_length=128,
                                                             n_mels=64).to(x.device)
            return mods[x.device](x)

        return mel_ember
    import torch

    fb = torch.from_numpy(np.asarray(__import__("ember").signal.melscale_fbanks(257, 0.0, 8000.0, 64, 16000)))
    win = torch.hann_window(512)

    def mel(x: Any) -> Any:
        spec = torch.stft(x, 512, 128, window=win, return_complex=True).abs() ** 2
        return (spec.transpose(-1, -2) @ fb).transpose(-1, -2)

    return mel


# name -> forward on a library module (ember or torch) -> function of the input
FUNCTIONS: dict[str, Callable[[Any], Callable[[Any], Any]]] = {
    "rfft": lambda lib: lambda x: lib.fft.rfft(x),
    "fft": lambda lib: lambda x: lib.fft.fft(x),
    "irfft(rfft)": lambda lib: lambda x: lib.fft.irfft(lib.fft.rfft(x), n=x.shape[-1]),
    "stft(n_fft=512)": lambda lib: lambda x: lib.stft(x, 512, 128, window=lib.hann_window(512, device=x.device),
                                                     return_complex=True),
    "MelSpectrogram": _mel,
}


#: the clock: wall time, or this process's CPU time (``--clock cpu``: with ``--threads 1`` it counts the work done and
#: not the time other processes hold the cores, which makes a busy shared machine usable)
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
_CLOCK: list[Callable[[], float]] = [time.perf_counter]


def _time(fn: Callable[[], Any], min_time: float, repeat: int) -> float:
    """Median seconds per call over ``repeat`` loops, each sized to take about ``min_time``."""
    clock = _CLOCK[0]
    fn()  # warm-up (kernel registration, caches)
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(min_time / one))
    runs = []
    for _ in range(repeat):
        t0 = clock()
        for _ in range(number):
            fn()
        runs.append((clock() - t0) / number)
    return statistics.median(runs)


def _loss(y: Any) -> Any:
    return (y.abs() ** 2).mean() if y.is_complex() else (y * y).mean()


def _row(name: str, a: np.ndarray, ember_fn: Callable[[Any], Any], torch_fn: Callable[[Any], Any], devices: Any,
         min_time: float, repeat: int) -> dict[str, Any]:
    """One benchmark row: forward and forward+backward of ember (flex, flex+autodiff) and torch on input a."""
    import torch

    import ember

    fwd_dev, bwd_dev = devices
    ex, tx = ember.tensor(a, device=fwd_dev), torch.from_numpy(a)

    def ember_bwd() -> Any:
        x = ember.tensor(a, device=bwd_dev, requires_grad=True)
        _loss(ember_fn(x)).backward()
        return x.grad.numpy()

    def torch_bwd() -> Any:
        x = torch.from_numpy(a).requires_grad_()
        _loss(torch_fn(x)).backward()
        return x.grad

    row: dict[str, Any] = {"function": name, "shape": list(a.shape),
                           "ember_fwd_us": _time(lambda: ember_fn(ex).numpy(), min_time, repeat) * 1e6,
                           "torch_fwd_us": _time(lambda: torch_fn(tx), min_time, repeat) * 1e6}
    try:
        row["ember_fwd_bwd_us"] = _time(ember_bwd, min_time, repeat) * 1e6
    except ember.EmberError as exc:  # autodiff without complex intermediates: say so, keep the row
        row["ember_fwd_bwd_us"] = None
        row["note"] = f"{type(exc).__name__}: {exc}"[:160]
    row["torch_fwd_bwd_us"] = _time(torch_bwd, min_time, repeat) * 1e6
    return row


def run(sizes: Sequence[tuple[int, ...]], names: Sequence[str], min_time: float, repeat: int) -> list[dict[str, Any]]:
    """The benchmark rows: one per (function, size), times in microseconds."""
    import torch

    import ember

    devices = (ember.device("flex"), ember.device("flex+autodiff"))
    rows = []
    for name in names:
        ember_fn, torch_fn = FUNCTIONS[name](ember), FUNCTIONS[name](torch)
        for size in sizes:
            a = np.random.default_rng(0).standard_normal(size).astype(np.float32)
            rows.append(_row(name, a, ember_fn, torch_fn, devices, min_time, repeat))
    return rows


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    """``ember bench signal [--quick] [--json PATH] [--only NAME ...]``: print the table (and write JSON)."""
    p = argparse.ArgumentParser(prog="ember bench signal", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, short timing loops (for tests)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--only", nargs="+", choices=sorted(FUNCTIONS), help="benchmark these functions only")
    p.add_argument("--min-time", type=float, default=None, help="seconds per timing loop (default 0.2, quick 0.01)")
    p.add_argument("--repeat", type=int, default=None, help="timing loops per row (default 5, quick 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="set both libraries' thread counts (ember.set_num_threads, torch.set_num_threads); on a "
                        "shared machine 1 keeps torch's spinning OpenMP threads from dominating its times")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time (default) or process CPU time (for a busy shared machine, with --threads 1)")
    args = p.parse_args(argv)
    _CLOCK[0] = CLOCKS[args.clock]
    if args.threads is not None:
        import torch

        import ember

        ember.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    sizes = SIZES_QUICK if args.quick else SIZES_FULL
    min_time = args.min_time if args.min_time is not None else (0.01 if args.quick else 0.2)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    rows = run(sizes, args.only or list(FUNCTIONS), min_time, repeat)
    head = f"{'function':<16} {'shape':<12} {'ember fwd us':>13} {'torch fwd us':>13} {'ember f+b us':>13} " \
           f"{'torch f+b us':>13}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['function']:<16} {'x'.join(map(str, r['shape'])):<12} {_fmt(r['ember_fwd_us']):>13} "
              f"{_fmt(r['torch_fwd_us']):>13} {_fmt(r['ember_fwd_bwd_us']):>13} {_fmt(r['torch_fwd_bwd_us']):>13}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"benchmark": "signal", "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
