"""The fuzz suite's helper modules (fuzz_engine, fuzz_ops) sit beside the tests; pytest's importlib mode does not
put this folder on ``sys.path``, so it is added here, once, before the test modules import them."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
