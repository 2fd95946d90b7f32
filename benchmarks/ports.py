"""Step-time benchmark of the PyTorch ports (issue 16): each program of ``examples/ports/`` -- the PyTorch original
under ``examples/ports/torch/`` and its ember port -- one training step as the program writes it, timed side by
side and alternating:

* ``torch cpu``: the PyTorch original
* ``ember fused``: the port on the default training device with fusion named, ``Device.default().fusion().autodiff()``
* ``ember unfused``: the same device with fusion off, ``Device.default().fusion(False).autodiff()``

Every case starts from the same weights (torch's initialisation, copied into ember through numpy) and trains on
the same batches; every step reads its loss value (``loss.item()``), so all its work is realized. Each figure is the
median over >= 5 timed repetitions after warm-up, with spread; ratios are of median times (> 1: ember slower).
On a shared or busy machine pass ``--threads 1``: torch's and numpy's thread pools spin-wait for busy cores, which
can make a small step many times slower than it is on an idle machine (both frameworks get the same limit).

Usage::

    python benchmarks/ports.py [--quick] [--json PATH] [--programs NAME ...] [--threads N]
    ember bench ports [--quick] [--json PATH] [--programs NAME ...] [--threads N]
    ember bench --only ports [--quick]          (the suite's optional ``ports`` section)
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by path (`ember bench`, the suite): make its siblings importable
    sys.path.insert(0, str(HERE))

from _common import bench_parser, describe_environment, environment, write_json  # noqa: E402
from micro import TORCH, figure, measure, torch_module  # noqa: E402

import ember  # noqa: E402
from ember import Device  # noqa: E402

PORTS = HERE.parent / "examples" / "ports"
FUSED = "ember fused"
UNFUSED = "ember unfused"
Step = Callable[[], float]
#: a program's benchmark setup: (torch step, ember step on a device, description of the configuration)
Setup = tuple[Callable[[], Step], Callable[[Device], Step], str]


def load_port(name: str, framework: str) -> ModuleType:
    """``examples/ports/<name>.py`` (``framework="ember"``) or ``examples/ports/torch/<name>.py``, imported by path
    under a private name (the originals' folder is called ``torch``: it must never be on sys.path)."""
    path = PORTS / (f"torch/{name}.py" if framework == "torch" else f"{name}.py")
    mod_name = f"_ember_port_{framework}_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"ports: cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[mod_name]


def torch_state(module: Any) -> dict[str, np.ndarray]:
    """A torch module's state_dict as numpy copies (the weights every case starts from)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_into(module: Any, state: dict[str, np.ndarray], device: Device) -> Any:
    """Load numpy weights (torch's names) into an ember module on ``device``; returns the module."""
    module.load_state_dict({k: ember.tensor(v, device=device) for k, v in state.items()})
    return module


# ----------------------------------------------------------------------------------------------------------
# programs
# ----------------------------------------------------------------------------------------------------------
def setup_word_lm(quick: bool) -> Setup:
    """pytorch/examples' defaults: emsize = nhid = 200, 2 layers, dropout 0.2, tied, bptt 35, batch 20, SGD lr 20
    with clip 0.25; the hidden state carries over between steps (repackaged) and batches cycle over the corpus."""
    torch = torch_module()
    tw, ew = load_port("word_lm", "torch"), load_port("word_lm", "ember")
    lines = tw.corpus_text(100 if quick else None)
    size, bsz, bptt = (16, 4, 8) if quick else (200, 20, 35)
    t_corpus = tw.Corpus(lines)
    ntokens = len(t_corpus.dictionary)
    torch.manual_seed(0)
    state = torch_state(tw.build(ntokens, torch.device("cpu"), emsize=size, nhid=size))
    ids = t_corpus.train.numpy()

    def make(mod: ModuleType, model: Any, data: Any) -> Step:
        hidden = model.init_hidden(bsz)
        starts = list(range(0, data.size(0) - 1 - bptt, bptt))
        pos = [0]
        model.train()

        def step() -> float:
            nonlocal hidden
            x, y = mod.get_batch(data, starts[pos[0] % len(starts)], bptt)
            pos[0] += 1
            loss, hidden = mod.train_step(model, x, y, hidden, 20.0)
            return float(loss)

        return step

    def torch_step() -> Step:
        cpu = torch.device("cpu")
        model = tw.build(ntokens, cpu, emsize=size, nhid=size)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        return make(tw, model, tw.batchify(torch.from_numpy(ids), bsz, cpu))

    def ember_step(dev: Device) -> Step:
        model = load_into(ew.build(ntokens, dev, emsize=size, nhid=size), state, dev)
        return make(ew, model, ew.batchify(ember.tensor(ids), bsz, dev))

    return torch_step, ember_step, f"vocab {ntokens}, LSTM 2x{size}, bptt {bptt}, batch {bsz}"


def _batches(arrays: Sequence[np.ndarray], batch: int, count: int) -> list[tuple[np.ndarray, ...]]:
    """``count`` consecutive batches of ``batch`` rows from each of ``arrays`` (the steps cycle over them)."""
    return [tuple(a[i * batch:(i + 1) * batch] for a in arrays) for i in range(count)]


def _cycle(fn: Callable[[tuple[Any, ...]], float], batches: list[tuple[Any, ...]]) -> Step:
    """A step that calls ``fn`` on the next batch, round-robin."""
    pos = [0]

    def step() -> float:
        b = batches[pos[0] % len(batches)]
        pos[0] += 1
        return float(fn(b))

    return step


def setup_mnist_cnn(quick: bool) -> Setup:
    """The example's Net (conv 32, conv 64, fc 9216-128-10, dropout in train mode), Adadelta lr 1, batch 64."""
    torch = torch_module()
    tp, ep = load_port("mnist_cnn", "torch"), load_port("mnist_cnn", "ember")
    bsz = 4 if quick else 64
    x, y = tp.digits_28x28()
    batches = _batches((x, y), bsz, 4)
    torch.manual_seed(0)
    state = torch_state(tp.build(torch.device("cpu"))[0])

    def torch_step() -> Step:
        model, opt, _ = tp.build(torch.device("cpu"))
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        model.train()
        data = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in batches]
        return _cycle(lambda b: tp.train_step(model, opt, *b), data)

    def ember_step(dev: Device) -> Step:
        model, opt, _ = ep.build(dev)
        load_into(model, state, dev).train()
        data = [(ember.tensor(a, device=dev), ember.tensor(b, device=dev)) for a, b in batches]
        return _cycle(lambda b: ep.train_step(model, opt, *b), data)

    return torch_step, ember_step, f"batch {bsz}, 1x28x28, Adadelta"


def setup_vae(quick: bool) -> Setup:
    """The example's VAE (784-400-20), Adam lr 1e-3, batch 128; its own randn_like noise on each side."""
    torch = torch_module()
    tv, ev = load_port("vae", "torch"), load_port("vae", "ember")
    bsz = 16 if quick else 128
    batches = _batches((tv.digits_28x28(),), bsz, 4)
    torch.manual_seed(0)
    state = torch_state(tv.build(torch.device("cpu"))[0])

    def torch_step() -> Step:
        model, opt = tv.build(torch.device("cpu"))
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        model.train()
        data = [(torch.from_numpy(a),) for (a,) in batches]
        return _cycle(lambda b: tv.train_step(model, opt, b[0]), data)

    def ember_step(dev: Device) -> Step:
        model, opt = ev.build(dev)
        load_into(model, state, dev).train()
        data = [(ember.tensor(a, device=dev),) for (a,) in batches]
        return _cycle(lambda b: ev.train_step(model, opt, b[0]), data)

    return torch_step, ember_step, f"batch {bsz}, fc 784-400-20, Adam"


def setup_dcgan(quick: bool) -> Setup:
    """One D step and one G step (two Adams), 32x32 grey images, nz 100, ngf = ndf = 32 (8 quick), batch 64."""
    torch = torch_module()
    tg, eg = load_port("dcgan", "torch"), load_port("dcgan", "ember")
    bsz, width = (4, 8) if quick else (64, 32)
    rng = np.random.default_rng(0)
    x = tg.digits_32x32()
    batches = [(x[i * bsz:(i + 1) * bsz], rng.standard_normal((bsz, 100, 1, 1), dtype=np.float32))
               for i in range(4)]
    torch.manual_seed(0)
    t_g, t_d = tg.build(torch.device("cpu"), ngf=width, ndf=width)[:2]
    states = (torch_state(t_g), torch_state(t_d))

    def torch_step() -> Step:
        parts = tg.build(torch.device("cpu"), ngf=width, ndf=width)
        for net, state in zip(parts[:2], states):
            net.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        data = [(torch.from_numpy(a), torch.from_numpy(z)) for a, z in batches]
        return _cycle(lambda b: sum(tg.train_step(*parts, *b)), data)

    def ember_step(dev: Device) -> Step:
        parts = eg.build(dev, ngf=width, ndf=width)
        for net, state in zip(parts[:2], states):
            load_into(net, state, dev)
        data = [(ember.tensor(a, device=dev), ember.tensor(z, device=dev)) for a, z in batches]
        return _cycle(lambda b: sum(eg.train_step(*parts, *b)), data)

    return torch_step, ember_step, f"batch {bsz}, 1x32x32, ngf = ndf = {width}"


def setup_text_classifier(quick: bool) -> Setup:
    """2 post-norm encoder layers (d 64, 4 heads, ff 128, dropout 0.1), seq 32, batch 32, AdamW + SequentialLR
    (the scheduler steps too), gradient clipping; padded generated sentences."""
    torch = torch_module()
    tt, et = load_port("text_classifier", "torch"), load_port("text_classifier", "ember")
    bsz = 8 if quick else 32
    tokens, labels, vocab = tt.make_dataset(4 * bsz)
    batches = _batches((tokens, labels), bsz, 4)
    args = (len(vocab), len(tt.TOPICS))
    kwargs = {"total_steps": 10_000, "warmup": 100}  # never runs out while timing
    torch.manual_seed(0)
    state = torch_state(tt.build(*args, torch.device("cpu"), **kwargs)[0])

    def torch_step() -> Step:
        parts = tt.build(*args, torch.device("cpu"), **kwargs)
        parts[0].load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        parts[0].train()
        data = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in batches]
        return _cycle(lambda b: tt.train_step(*parts, *b), data)

    def ember_step(dev: Device) -> Step:
        parts = et.build(*args, dev, **kwargs)
        load_into(parts[0], state, dev).train()
        data = [(ember.tensor(a, device=dev), ember.tensor(b, device=dev)) for a, b in batches]
        return _cycle(lambda b: et.train_step(*parts, *b), data)

    return torch_step, ember_step, f"batch {bsz}, seq 32, 2 layers d 64"


def setup_resnet_block(quick: bool) -> Setup:
    """3 stages of 2 BasicBlocks (widths 16/32/64; 1 block of width 4 quick), 3x32x32 images, batch 32, SGD
    Nesterov + weight decay, CosineAnnealingLR (the scheduler steps too)."""
    torch = torch_module()
    tr, er = load_port("resnet_block", "torch"), load_port("resnet_block", "ember")
    bsz, width, blocks = (4, 4, (1, 1, 1)) if quick else (32, 16, (2, 2, 2))
    batches = _batches(tr.make_images(4 * bsz), bsz, 4)
    kwargs = {"width": width, "num_blocks": blocks, "total_steps": 10_000}
    torch.manual_seed(0)
    state = torch_state(tr.build(torch.device("cpu"), **kwargs)[0])

    def torch_step() -> Step:
        parts = tr.build(torch.device("cpu"), **kwargs)
        parts[0].load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        parts[0].train()
        data = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in batches]
        return _cycle(lambda b: tr.train_step(*parts, *b), data)

    def ember_step(dev: Device) -> Step:
        parts = er.build(dev, **kwargs)
        load_into(parts[0], state, dev).train()
        data = [(ember.tensor(a, device=dev), ember.tensor(b, device=dev)) for a, b in batches]
        return _cycle(lambda b: er.train_step(*parts, *b), data)

    return torch_step, ember_step, f"batch {bsz}, 3x32x32, widths {width}/{2 * width}/{4 * width}, blocks {blocks}"


PROGRAMS: dict[str, Callable[[bool], Setup]] = {
    "word_lm": setup_word_lm,
    "mnist_cnn": setup_mnist_cnn,
    "vae": setup_vae,
    "dcgan": setup_dcgan,
    "text_classifier": setup_text_classifier,
    "resnet_block": setup_resnet_block,
}


# ----------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------
def set_threads(n: int) -> None:
    """The same thread limit for both frameworks."""
    ember.set_num_threads(n)
    torch = torch_module()
    if torch is not None:
        torch.set_num_threads(n)


def devices() -> dict[str, Device]:
    """The two ember training devices: the default device's backend with autodiff and fusion named (flex declines
    automatic fusion) and the same with fusion off; decorators EMBER_DEVICE may name are dropped, so the two differ
    only in fusion."""
    default = Device.default()
    base = Device(default.kind, default.index)
    return {FUSED: base.fusion().autodiff(), UNFUSED: base.fusion(False).autodiff()}


def bench_program(name: str, quick: bool, repeats: int, warmup: int) -> dict[str, Any]:
    """One figure: median step time of torch, ember fused and ember unfused, alternating."""
    make_torch, make_ember, config = PROGRAMS[name](quick)
    cases: dict[str, Step] = {FUSED: make_ember(devices()[FUSED]), UNFUSED: make_ember(devices()[UNFUSED])}
    if torch_module() is not None:
        cases[TORCH] = make_torch()
    seconds = measure(cases, repeats, 1, warmup)
    extra: dict[str, Any] = {"program": name, "config": config, "fused_case": FUSED, "unfused_case": UNFUSED,
                             "speedup_fused": seconds[UNFUSED]["median"] / seconds[FUSED]["median"],
                             "ratio_unfused_torch": None}
    if TORCH in seconds:
        extra["ratio_unfused_torch"] = seconds[UNFUSED]["median"] / seconds[TORCH]["median"]
    return figure("ports", f"{name} train step ({config})", "ms", seconds, ember_case=FUSED, **extra)


def plan(quick: bool) -> dict[str, int]:
    """Repeat counts: >= 5 timed repeats everywhere; quick shrinks the programs, not the statistics."""
    # 6 warm-up steps: flex tries numpy and numexpr for each fused kernel's first calls (fusion.TRIALS per path)
    return {"repeats": 5, "warmup": 1} if quick else {"repeats": 7, "warmup": 6}


def run(quick: bool, programs: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The figures of ``programs`` (all when empty), in PROGRAMS' order."""
    p = plan(quick)
    figures = []
    for name in PROGRAMS:
        if programs and name not in programs:
            continue
        t0 = time.perf_counter()
        figures.append(bench_program(name, quick, p["repeats"], p["warmup"]))
        print(f"[ports {name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    return figures


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def format_ports(figures: list[dict[str, Any]]) -> str:
    """Per program: median step times (ms) and the ratios ember/torch (fused, unfused) and fused/unfused."""
    header = ["program", "torch ms", "fused ms", "unfused ms", "fused/torch", "unfused/torch", "fused/unfused",
              "configuration"]
    rows = [header]
    for fig in figures:
        s = fig["seconds"]
        ms = [f"{s[c]['median'] * 1e3:.2f}" if c in s else "-" for c in (TORCH, FUSED, UNFUSED)]
        rows.append([fig["program"], *ms, _ratio(fig["ratio_ember_torch"]), _ratio(fig["ratio_unfused_torch"]),
                     _ratio(1.0 / fig["speedup_fused"]), fig["config"]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("ember benchmark: train-step time of the PyTorch ports (examples/ports), ember vs torch",
                          "small configurations (CI smoke)", tuple(PROGRAMS), flag="--programs")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="limit torch's and ember's thread pools to N (ember.set_num_threads, "
                             "torch.set_num_threads); default: each framework's own")
    args = parser.parse_args(argv)
    if args.threads is not None:
        set_threads(args.threads)
    env = environment()
    print(describe_environment(env))
    print(f"ember fused = {devices()[FUSED]}, unfused = {devices()[UNFUSED]}; median of >= 5 alternating repeats "
          "after warm-up; ratios of median times (> 1: the first is slower)\n", flush=True)
    figures = run(args.quick, args.programs or ())
    print(format_ports(figures))
    if args.json:
        write_json(args.json, {"benchmark": "ports", "quick": args.quick, "figures": figures, "environment": env,
                               "threads": args.threads})
    return 0


if __name__ == "__main__":
    sys.exit(main())
