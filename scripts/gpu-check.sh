#!/usr/bin/env bash
# scripts/gpu-check.sh: ember-cuda on a machine with an NVIDIA GPU, in one run (< 8 minutes), without network.
#
# Expects the image's preinstalled CuPy for CUDA 13 (cupy-cuda13x) and torch with CUDA. Installs the checkout
# editable without dependencies, then:
#   1. facts: `ember info` (driver, runtime, compute capability), `ember kernels check --target cuda` (NVRTC);
#   2. the conformance kit on `cuda`, and on `cuda+autodiff+fusion` (autodiff and fusion);
#   3. the seed-CNN and the seed text-transformer training steps, ember on cuda vs torch on cuda (same weights,
#      same batch), median step times and the first-step (cold) time; the conv path (cuDNN or im2col + cuBLAS) and
#      a memory_dry_run() of one CNN step;
# and writes everything to one JSON (default gpu-check.json; first argument overrides).
#
#   scripts/gpu-check.sh [out.json]
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/gpu-check.json}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PY="${PYTHON:-python3}"
export EMBER_STRICT_PLUGINS=1
START=$(date +%s)

cd "$ROOT"
# --no-deps --no-build-isolation: no network; CuPy (cupy-cuda13x), numpy, torch and pytest come from the image
"$PY" -m pip install -q --no-deps --no-build-isolation \
    -e packages/ember-core -e packages/ember-kernels -e packages/ember-cupy -e plugins/backends/ember-cuda \
    -e plugins/backends/ember-flex -e plugins/decorators/ember-autodiff -e plugins/decorators/ember-fusion \
    -e packages/ember-train > "$WORK/install.log" 2>&1
INSTALL_RC=$?

# 1. facts and the NVRTC compile check (through the image's CUDA 13 NVRTC)
timeout 60 "$PY" -c "import sys; from ember.cli import main; sys.exit(main(['info']))" > "$WORK/info.txt" 2>&1
# the compile check is single-threaded CPU work: it runs beside the kits (16 cores), not beside the benchmark
( timeout 240 "$PY" -c "import sys; from ember.cli import main; sys.exit(main(['kernels', 'check', '--target', 'cuda',
    '--arch', 'compute_90']))" > "$WORK/kernels.txt" 2>&1; echo $? > "$WORK/kernels.rc" ) &
KERNELS_PID=$!

# 2. the conformance kit: plain cuda, then with autodiff and fusion (xdist over the CPU cores; one GPU)
# pytest (and hypothesis, which the kit imports) must be in the image; xdist is used when present
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 4)
kit() {  # kit NAME DEVICE TIMEOUT
    timeout "$3" "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" --pyargs ember.testing --ember-device="$2" \
        --junitxml="$WORK/$1.xml" > "$WORK/$1.txt" 2>&1
    echo $? > "$WORK/$1.rc"
}
kit kit_cuda cuda 160
kit kit_cuda_autodiff_fusion "cuda+autodiff+fusion" 160
wait "$KERNELS_PID"
KERNELS_RC=$(cat "$WORK/kernels.rc" 2>/dev/null || echo -1)

# 3. training steps: ember on cuda vs torch on cuda
timeout 120 "$PY" - "$WORK/bench.json" <<'PYEOF' > "$WORK/bench.txt" 2>&1
import json, statistics, sys, time
import numpy as np
import torch
import ember
from ember_train.models import seed_cnn, text_transformer
sys.path.insert(0, "benchmarks")
from transformer import copy_to_torch, token_batch, torch_text_transformer  # noqa: E402

def timed(step, n=15, warm=3):
    t0 = time.perf_counter(); step(); first = time.perf_counter() - t0
    for _ in range(warm):
        step()
    times = []
    for _ in range(n):
        t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
    return {"first_s": first, "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times)}

res = {}
dev = ember.device("cuda+autodiff")  # training records gradients (fusion applies automatically where installed)
tdev = torch.device("cuda")
# seed CNN, batch 128, Adam
x = np.random.default_rng(0).standard_normal((128, 1, 28, 28)).astype(np.float32)
y = np.random.default_rng(1).integers(0, 10, 128)
try:
    m = seed_cnn().to(dev); opt = ember.optim.Adam(m.parameters(), lr=1e-3)
    ex, ey = ember.tensor(x, device=dev), ember.tensor(y, device=dev)
    lossf = ember.nn.CrossEntropyLoss()
    def estep():
        opt.zero_grad(); loss = lossf(m(ex), ey); loss.backward(); opt.step(); ember.cuda.synchronize()
    res["seed_cnn_ember_cuda"] = timed(estep)
    # the conv path taken (cuDNN only with CuPy <= 13), and one step under memory_dry_run (its plan, then a step)
    res["conv_path"] = "cudnn" if dev.stack.base_backend.cudnn() is not None else "im2col+cublas"
    with dev.memory_dry_run() as plan:
        estep()
    estep()
    res["seed_cnn_dry_run"] = {k: plan.get(k) for k in ("allocations", "frees", "carried", "peak_in_use",
                                                         "plan_bytes", "reserved")}
except Exception as exc:
    res["seed_cnn_ember_cuda"] = res.get("seed_cnn_ember_cuda") or {"error": f"{type(exc).__name__}: {exc}"}
    res["seed_cnn_extras_error"] = f"{type(exc).__name__}: {exc}"
tm = torch.nn.Sequential(torch.nn.Conv2d(1, 64, 3), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                         torch.nn.Conv2d(64, 64, 3), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                         torch.nn.Flatten(), torch.nn.Linear(1600, 128), torch.nn.GELU(), torch.nn.Dropout(0.25),
                         torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Dropout(0.25),
                         torch.nn.Linear(128, 10)).to(tdev)
topt = torch.optim.Adam(tm.parameters(), lr=1e-3)
tx, ty = torch.tensor(x, device=tdev), torch.tensor(y, device=tdev)
def tstep():
    topt.zero_grad(); loss = torch.nn.functional.cross_entropy(tm(tx), ty); loss.backward(); topt.step()
    torch.cuda.synchronize()
res["seed_cnn_torch_cuda"] = timed(tstep)
# seed text transformer ("small"), batch 32, AdamW
tokens, labels = token_batch("small", 32)
try:
    em = text_transformer("small").to(dev); eopt = ember.optim.AdamW(em.parameters(), lr=1e-3)
    et, el = ember.tensor(tokens, device=dev), ember.tensor(labels, device=dev)
    def etstep():
        eopt.zero_grad(); loss = ember.nn.functional.cross_entropy(em(et), el); loss.backward(); eopt.step()
        ember.cuda.synchronize()
    res["transformer_ember_cuda"] = timed(etstep)
except Exception as exc:
    em = None
    res["transformer_ember_cuda"] = {"error": f"{type(exc).__name__}: {exc}"}
tt = torch_text_transformer("small")
if em is not None:
    try:
        copy_to_torch(em, tt)
    except Exception as exc:
        res["transformer_weight_copy"] = f"{type(exc).__name__}: {exc}"
tt = tt.to(tdev); ttopt = torch.optim.AdamW(tt.parameters(), lr=1e-3)
ttk, ttl = torch.tensor(tokens, device=tdev), torch.tensor(labels, device=tdev)
def ttstep():
    ttopt.zero_grad(); loss = torch.nn.functional.cross_entropy(tt(ttk), ttl); loss.backward(); ttopt.step()
    torch.cuda.synchronize()
res["transformer_torch_cuda"] = timed(ttstep)
res["gpu"] = torch.cuda.get_device_name(0)
json.dump(res, open(sys.argv[1], "w"), indent=1)
PYEOF
BENCH_RC=$?

# one JSON: facts, kernel check, kit summaries, benchmarks, exit codes
"$PY" - "$WORK" "$OUT" "$INSTALL_RC" "$KERNELS_RC" "$BENCH_RC" "$START" <<'PYEOF'
import json, pathlib, re, sys, time, datetime
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
install_rc, kernels_rc, bench_rc, start = map(int, sys.argv[3:7])
def read(name):
    p = work / name
    return p.read_text(errors="replace") if p.exists() else ""
def kit(name):
    text = read(f"{name}.txt")
    tail = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    failed = [ln.split(" ")[1] for ln in text.splitlines() if ln.startswith("FAILED ")]
    return {"rc": int(read(f"{name}.rc").strip() or -1), "summary": tail[-1] if tail else text[-800:],
            "failed": failed[:200]}
kernels = read("kernels.txt")
summary = [ln for ln in kernels.splitlines() if "compiled," in ln or "skipped" in ln]
bench = json.loads(read("bench.json")) if (work / "bench.json").exists() else {"error": read("bench.txt")[-2000:]}
doc = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "install_rc": install_rc,
    "info": read("info.txt"),
    "kernels_check": {"rc": kernels_rc, "summary": summary[-1] if summary else kernels[-2000:]},
    "kit_cuda": kit("kit_cuda"),
    "kit_cuda_autodiff_fusion": kit("kit_cuda_autodiff_fusion"),
    "bench": bench,
    "bench_rc": bench_rc,
    "wall_s": round(time.time() - start, 1),
}
out.write_text(json.dumps(doc, indent=1))
print(json.dumps({k: doc[k] for k in ("kernels_check", "wall_s")}, indent=1))
print("kit cuda:", doc["kit_cuda"]["summary"])
print("kit cuda+autodiff+fusion:", doc["kit_cuda_autodiff_fusion"]["summary"])
print("bench:", json.dumps(bench))
print(f"wrote {out}")
PYEOF
