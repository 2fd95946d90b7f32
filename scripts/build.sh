#!/usr/bin/env bash
# Build a wheel (and sdist) for every package of the monorepo into dist/ -- the "hatch build --all" of this repo.
# Usage: scripts/build.sh [OUTDIR]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-dist}"
mkdir -p "$OUT"
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m pip install -q build 2> >(grep -v "is ignored: it is neither" >&2)

for pkg in packages/*/ plugins/*/*/; do
    [[ -f "$pkg/pyproject.toml" ]] || continue
    echo "==> $pkg"
    "$PY" -m build --outdir "$OUT" "$pkg" > /dev/null
done
ls -1 "$OUT"
