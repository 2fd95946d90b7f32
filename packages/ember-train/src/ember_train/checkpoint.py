"""Training checkpoints over ``ember.records``: atomic save, load, model-compatibility check and rotation.

A checkpoint is one safetensors file holding a nested record: ``{"format", "epoch", "model", "optimizer",
"scheduler", "train_loader", "seed", "global_step", "history", "best", ...}``. Files are named
``checkpoint-epoch{N}.safetensors`` (N = completed epochs, 1-based) plus ``best.safetensors``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from ember import Tensor, records
from ember.device import Device
from ember.records import IncompatibleStateError, LoadReport, RecordError

__all__ = [
    "FORMAT",
    "BEST_NAME",
    "checkpoint_path",
    "list_checkpoints",
    "latest_checkpoint",
    "save_checkpoint",
    "load_checkpoint",
    "check_model_state",
    "load_model_weights",
    "rotate_checkpoints",
    "deferred_sigint",
]

FORMAT = "ember_train.checkpoint/1"
BEST_NAME = "best.safetensors"
_NAME = re.compile(r"^checkpoint-epoch(\d+)\.safetensors$")


def checkpoint_path(out_dir: str | os.PathLike[str], epoch: int) -> str:
    """``out_dir/checkpoint-epoch{epoch}.safetensors``."""
    return os.path.join(os.fspath(out_dir), f"checkpoint-epoch{epoch}.safetensors")


def list_checkpoints(out_dir: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``[(epoch, path), ...]`` of the epoch checkpoints in ``out_dir``, oldest first (empty if none)."""
    d = os.fspath(out_dir)
    if not os.path.isdir(d):
        return []
    found = [(int(m.group(1)), os.path.join(d, name)) for name in os.listdir(d) if (m := _NAME.match(name))]
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> str | None:
    """Path of the newest epoch checkpoint in ``out_dir``, or None."""
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def rotate_checkpoints(out_dir: str | os.PathLike[str], keep_last: int | None) -> list[str]:
    """Delete all but the newest ``keep_last`` epoch checkpoints (None keeps all); returns the deleted paths.

    ``best.safetensors`` is a separate file and is never touched.
    """
    if keep_last is None:
        return []
    found = list_checkpoints(out_dir)
    doomed = [p for _, p in found[: max(len(found) - keep_last, 0)]]
    for p in doomed:
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)
    return doomed


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Hold off Ctrl-C while the block runs, then raise KeyboardInterrupt if one arrived.

    Checkpoint writes are atomic anyway; deferring means a Ctrl-C during the write still leaves the new file
    complete instead of keeping the previous one. Only possible on the main thread (elsewhere it is a no-op).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hit: list[int] = []
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
    except ValueError:  # not allowed here (an embedded interpreter): nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if hit:
        raise KeyboardInterrupt


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write a checkpoint record atomically (Ctrl-C waits until the file is complete)."""
    meta = {"ember_train.format": FORMAT, "ember_train.epoch": str(state.get("epoch", ""))}
    with deferred_sigint():
        records.save(dict(state), path, metadata=meta)


def load_checkpoint(path: str | os.PathLike[str], device: Any = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on ``device``, host ``flex`` by default)."""
    p = os.fspath(path)
    state = records.load(p, device=device if device is not None else Device.flex())
    if not isinstance(state, dict) or state.get("format") != FORMAT or "model" not in state:
        raise RecordError(f"load_checkpoint: {p!r} is not an ember-train checkpoint (no {FORMAT!r} record); "
                          "for plain weights use records.load_into(model, path)")
    return state


def check_model_state(model: Any, state: Mapping[str, Tensor], path: str) -> LoadReport:
    """Compare a checkpoint's model state with ``model``; raise IncompatibleStateError naming every bad key."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [(k, tuple(state[k].shape), tuple(own[k].shape)) for k in own
                  if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    report = LoadReport(missing, unexpected, mismatched)
    if not report.clean:
        raise IncompatibleStateError(
            f"checkpoint {path!r} was saved from a different model than {type(model).__name__}: {report.describe()}",
            report)
    return report


def load_model_weights(model: Any, path: str | os.PathLike[str]) -> LoadReport:
    """Load model weights from an ember-train checkpoint or a plain state-dict record (for inference)."""
    p = os.fspath(path)
    meta = records.read_metadata(p)
    if meta.get("ember_train.format") != FORMAT:
        return records.load_into(model, p)
    state = load_checkpoint(p)["model"]
    report = check_model_state(model, state, p)
    model.load_state_dict(state)
    return report
