#!/usr/bin/env bash
# Set everything up, then run the main job (scripts/demo.py) on the default device.
# Pass-through arguments go to demo.py; EMBER_DEVICE=NAME picks another device.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
