#!/usr/bin/env bash
# Set everything up, then run the main job on the default device: `ember train seed-cnn` (scripts/demo.py), the
# seed CNN on the digits with the live dashboard, ending with the validation accuracy and the time taken.
# Pass-through arguments go to `ember train seed-cnn` (e.g. --epochs 4, --quick); EMBER_DEVICE=NAME picks another
# device. Setup installs only what the demo needs (no test tools) and is skipped while .venv is up to date.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

scripts/setup.sh demo
exec .venv/bin/python scripts/demo.py "$@"
