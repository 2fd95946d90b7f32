#!/usr/bin/env bash
# Create (or refresh) the development environment: .venv at the repository root with every ember package
# installed editable, the test extras (pytest, hypothesis, torch) and the dev tools (ruff, nox, Sphinx).
# Idempotent: safe to run again; a second run only re-checks the installs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# pip warns once per package about local index folders that lack it; that is not a problem, so hide it.
pip_install() {
    "${PIP[@]}" install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

pip_install --upgrade pip

# An OpenCL platform for ember-opencl's tests and kit run: when the machine has none (no ICD registered), install
# PoCL, the portable CPU OpenCL runtime, from the system's Debian packages (needs root; skipped otherwise).
if [[ ! -d /etc/OpenCL/vendors || -z "$(ls -A /etc/OpenCL/vendors 2>/dev/null)" ]]; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "setup: no OpenCL platform found; installing PoCL (pocl-opencl-icd)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd ocl-icd-libopencl1 >/dev/null
    else
        echo "setup: no OpenCL platform found and cannot install PoCL (not root or no apt-get); OpenCL tests skip"
    fi
fi

# First-party packages, editable. torch==2.13.0 comes with core's `test` extra (plain pip; it is a local file).
PACKAGES=(
    -e "packages/ember-core[test]"
    -e "plugins/backends/ember-flex"
    -e "plugins/decorators/ember-autodiff"
    -e "plugins/backends/ember-opencl"
    -e "plugins/decorators/ember-fusion"
    -e "packages/ember-train[plot]"
    -e "packages/ember"
    # the third-party example plugin used by the cross-plugin tests and the docs
    -e "tests/example-backend"
)

DEV_TOOLS=(ruff nox sphinx pydata-sphinx-theme myst-parser)

pip_install "${PACKAGES[@]}" "${DEV_TOOLS[@]}"
echo "setup: .venv ready"
