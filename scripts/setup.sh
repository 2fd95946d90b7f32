#!/usr/bin/env bash
# Create (or refresh) the environment: .venv at the repository root with every ember package installed editable.
#
#   scripts/setup.sh demo     what `./scripts/demo.sh` needs: the packages and their runtime dependencies only
#   scripts/setup.sh [test]   everything for `./scripts/test.sh` and development: the above, plus the test extras
#                             (pytest, hypothesis, torch as the oracle), the example plugin tests/example-backend,
#                             the plugins with heavy dependencies (wgpu, cuda, rocm, onnx, distributed), the dev
#                             tools (ruff, nox, Sphinx) and, as root, PoCL and lavapipe where no OpenCL or Vulkan
#                             driver is present
#   --force                   reinstall even when the environment is up to date
#
# Up to date means: a stamp in .venv records a hash of this script and of every package's pyproject.toml, per level;
# when it matches, setup is skipped (a `test` stamp also satisfies `demo`, which it includes). Editable installs
# pick up source changes by themselves; a changed pyproject.toml (dependencies, entry points) triggers a reinstall.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

LEVEL=test
FORCE=0
for arg in "$@"; do
    case "$arg" in
        demo | test) LEVEL="$arg" ;;
        --force) FORCE=1 ;;
        *) echo "usage: scripts/setup.sh [demo|test] [--force]" >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
STAMP_DIR="$VENV/.ember-setup"

# Everything that decides what gets installed: this script and the packages' metadata.
PYPROJECTS=(packages/*/pyproject.toml plugins/*/*/pyproject.toml tests/example-backend/pyproject.toml)
fingerprint() {
    "$PYTHON" -c 'import hashlib, sys
h = hashlib.sha256()
for name in sys.argv[1:]:
    h.update(name.encode() + b"\0")
    with open(name, "rb") as f:
        h.update(f.read() + b"\0")
print(h.hexdigest())' scripts/setup.sh "${PYPROJECTS[@]}"
}
FINGERPRINT="$(fingerprint)"

up_to_date() {  # up_to_date LEVEL...: true when .venv holds a stamp of any of these levels for this fingerprint
    [[ -x "$VENV/bin/python" ]] || return 1
    local level
    for level in "$@"; do
        [[ "$(cat "$STAMP_DIR/$level" 2>/dev/null)" == "$FINGERPRINT" ]] && return 0
    done
    return 1
}

if [[ "$FORCE" == 0 ]]; then
    satisfied_by=("$LEVEL")
    [[ "$LEVEL" == demo ]] && satisfied_by+=(test)
    if up_to_date "${satisfied_by[@]}"; then
        echo "setup ($LEVEL): .venv is up to date"
        exit 0
    fi
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# pip warns once per package about local index folders that lack it; that is not a problem, so hide it.
pip_install() {
    "${PIP[@]}" install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
    pip_install --upgrade pip
fi
rm -rf "$STAMP_DIR"  # an interrupted install must not leave a stamp that claims otherwise

# First-party packages, editable, with their runtime dependencies: what the demo and any user program need.
# Core's `test` extra adds pytest, xdist, hypothesis and torch==2.13.0 (the tests' oracle; a local wheel).
# apt_install WHAT PACKAGE...: install system packages (root and apt-get only; else say what will be skipped).
apt_install() {
    local what="$1"; shift
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "setup: installing $what: $*"
        [[ -n "${APT_UPDATED:-}" ]] || { apt-get update -qq; APT_UPDATED=1; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    else
        echo "setup: $what is missing and cannot be installed (not root or no apt-get); the tests that need it skip"
    fi
}

if [[ "$LEVEL" == test ]]; then CORE="packages/ember-core[test]"; else CORE="packages/ember-core"; fi
RUNTIME=(
    -e "$CORE"
    -e "plugins/backends/ember-flex"
    -e "plugins/decorators/ember-autodiff"
    -e "packages/ember-kernels"
    -e "plugins/backends/ember-opencl"
    -e "plugins/decorators/ember-fusion"
    -e "plugins/decorators/ember-router"
    -e "plugins/backends/ember-remote[init]"
    -e "plugins/extensions/ember-lora"
    -e "plugins/extensions/ember-linalg"
    -e "plugins/extensions/ember-signal"
    -e "packages/ember-train[plot]"
    -e "packages/ember"
)

# Tests and development: the third-party example plugin used by the cross-plugin tests and the docs, and the dev
# tools.
# The plugins with large or system-bound dependencies join here, so the demo's setup stays small: wgpu (wgpu-native),
# the CuPy backends (cupy-cuda12x, and NVRTC for `ember kernels check --target cuda` without a GPU), ONNX (onnx, with
# onnxruntime as the tests' oracle) and MPI (mpi4py with the MPICH wheel, whose mpiexec the distributed tests run).
TESTING=(
    -e "tests/example-backend"
    -e "plugins/backends/ember-wgpu"
    -e "packages/ember-cupy"
    -e "plugins/backends/ember-cuda[nvrtc]"
    -e "plugins/backends/ember-rocm"
    -e "plugins/extensions/ember-onnx[test]"
    -e "plugins/extensions/ember-distributed[mpich]"
    ruff nox sphinx pydata-sphinx-theme myst-parser
)

if [[ "$LEVEL" == test ]]; then
    # System packages the test suite runs on, installed from the system's Debian packages when missing (as root;
    # else the tests that need them skip and say why):
    # - PoCL, the portable CPU OpenCL runtime, when no OpenCL ICD is registered (ember-opencl's tests and kit);
    # - Mesa's lavapipe, a CPU Vulkan driver, when no Vulkan ICD is registered (ember-wgpu's tests and kit);
    # - clang, which compiles the HIP kernel texts of ember-rocm where hiprtc is absent (`ember kernels check`).
    if [[ ! -d /etc/OpenCL/vendors || -z "$(ls -A /etc/OpenCL/vendors 2>/dev/null)" ]]; then
        apt_install "an OpenCL platform (PoCL)" pocl-opencl-icd ocl-icd-libopencl1
    fi
    if [[ -z "$(ls -A /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null)" ]]; then
        apt_install "a Vulkan driver (Mesa lavapipe)" mesa-vulkan-drivers libvulkan1
    fi
    if ! command -v clang >/dev/null; then
        apt_install "clang (the HIP compile check)" clang
    fi
    echo "setup (test): installing the packages, test extras and dev tools"
    pip_install "${RUNTIME[@]}" "${TESTING[@]}"
else
    echo "setup (demo): installing the packages and their runtime dependencies"
    pip_install "${RUNTIME[@]}"
fi

mkdir -p "$STAMP_DIR"
echo "$FINGERPRINT" > "$STAMP_DIR/$LEVEL"
echo "setup ($LEVEL): .venv ready"
