#!/usr/bin/env bash
# Set everything up (scripts/setup.sh test; skipped while .venv is up to date), then run the whole test suite.
# Stops at the first failing step.
#   1. lint (ruff)
#   2. unit + cross-plugin tests (pytest testpaths from pyproject.toml), then the CUDA/HIP kernel compile checks
#   3. the conformance kit against the fused flex device (flex+fusion: flex declines automatic fusion, so it is named;
#      ember-fusion records every op and fuses, gradients over it) and, through nox, flex
#      alone (`nox -l`, then `nox -s core_flex`: a fresh venv with ember-core and ember-flex only, flex's tests and
#      the kit on the backend's own ops), which also proves the nox sessions install from a fresh clone
#   4. the conformance kit against tests/example-backend (toy), which proves the default compositions
#   5. the conformance kit through the autodiff decorator (flex+autodiff, the default device's stack), and
#      through the router over it (flex+autodiff+router(local)), and on `remote` (an `ember serve` subprocess on
#      loopback: every op over the wire)
#   6. the OpenCL plugin's tests and the conformance kit on fused OpenCL, opencl+fusion (PoCL, the CPU OpenCL
#      runtime setup.sh installs when there is no GPU driver)
#   7. the wgpu plugin's tests and the conformance kit on wgpu (lavapipe, the CPU Vulkan driver setup.sh installs)
#   8. the code examples in the docs
#   9. the docs build (warnings are errors)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

scripts/setup.sh test

# A plugin that fails to load is an error here, not a logged warning.
export EMBER_STRICT_PLUGINS=1
PY=.venv/bin/python

step() { printf '\n==> %s\n' "$*"; }

step "lint"
.venv/bin/ruff check .

step "tests"
# two workers (xdist): the suite is CPU-bound and the machines have two cores
# the OpenCL and wgpu plugins' own tests run with their kits below
"$PY" -m pytest -n 2 --ignore-glob='*/ember-opencl/tests/*' --ignore-glob='*/ember-wgpu/tests/*'

step "GPU kernels compiled without a GPU: every CUDA kernel source through NVRTC, HIP through hiprtc or clang where one is found"
.venv/bin/ember kernels check --target cuda
.venv/bin/ember kernels check --target hip

step "conformance kit (flex+fusion, recording every op: eager_below=0, so small tensors take the fused path too)"
# flex is unfused unless fusion is named (it declines automatic fusion); the flex+autodiff run below covers that
# default, this one the recording, planning and fused kernels (and gradients over them)
"$PY" -m pytest -p no:cacheprovider -n 2 --pyargs ember.testing "--ember-device=flex+fusion(eager_below=0)" -q

step "nox: sessions listed, and core_flex (ember-core + ember-flex alone: flex's tests, the kit on unfused flex)"
.venv/bin/nox -l
.venv/bin/nox -s core_flex

step "conformance kit (toy: the third-party example backend, required primitives only)"
"$PY" -m pytest -p no:cacheprovider -n 2 --pyargs ember.testing --ember-device=toy -q

step "conformance kit (flex+autodiff: the autodiff decorator over flex)"
"$PY" -m pytest -p no:cacheprovider -n 2 --pyargs ember.testing --ember-device=flex+autodiff -q

step "conformance kit (flex+autodiff+router(local): every op as ember.ir records through the router, graphs replayed)"
"$PY" -m pytest -p no:cacheprovider -n 2 --pyargs ember.testing "--ember-device=flex+autodiff+router(local)" -q

step "conformance kit (remote: an ember serve subprocess on 127.0.0.1, a free port, every op over the wire)"
"$PY" -m ember_remote.kit -p no:cacheprovider -n 2 -q

step "OpenCL: plugin tests and conformance kit (generated OpenCL kernels, on whatever OpenCL device 0 is here)"
if "$PY" -c "import sys, ember_opencl.runtime as r; sys.exit(0 if r.list_devices() else 1)"; then
    # two workers: a cold start (empty kernel caches) is bound by kernel compiles, which are single-threaded
    "$PY" -m pytest -p no:cacheprovider -n 2 plugins/backends/ember-opencl/tests -q
    # fusion named: on a CPU driver OpenCL is unfused unless asked (the plugin's tests above run it unfused, and so
    # does nox's opencl session); a GPU fuses unnamed, so the fused path is the one the kit must hold to
    "$PY" -m pytest -p no:cacheprovider -n 2 --pyargs ember.testing "--ember-device=opencl+fusion" -q
else
    echo "no OpenCL platform on this machine (scripts/setup.sh installs PoCL when run as root): skipped"
fi

step "wgpu: plugin tests and conformance kit (WGSL kernels on Vulkan: Mesa lavapipe where there is no GPU)"
if "$PY" -c "import sys, ember_wgpu.runtime as r; sys.exit(0 if r.device_count() else 1)"; then
    # the kit on two workers, as OpenCL's: its time is mostly Python per test (torch oracle, dispatch, submits and
    # read-backs), not lavapipe's shaders; the plugin's own tests stay in one process (worker start-up outweighs them)
    "$PY" -m pytest -p no:cacheprovider plugins/backends/ember-wgpu/tests -q
    "$PY" -m pytest -p no:cacheprovider -n 2 --pyargs ember.testing --ember-device=wgpu -q
else
    echo "no Vulkan/Metal/DX12 adapter on this machine (scripts/setup.sh installs lavapipe when run as root): skipped"
fi

step "docs examples"
# Exit code 5 means "no examples collected": not a failure while pages have none.
rc=0
"$PY" -m pytest -p no:cacheprovider --doctest-glob='*.md' docs -q || rc=$?
if [[ $rc -ne 0 && $rc -ne 5 ]]; then
    exit "$rc"
fi

step "docs build"
.venv/bin/sphinx-build -W -b html docs docs/_build/html -q

step "all checks passed"
