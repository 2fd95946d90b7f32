"""Training checkpoints over ``ember.records``: atomic save, load, model-compatibility check and rotation.

A checkpoint is one safetensors file holding a nested record: ``{"format", "epoch", "model", "optimizer",
"scheduler", "train_loader", "seed", "global_step", "history", "best", ...}``. Files are named
``checkpoint-epoch{N}.safetensors`` (N = completed epochs, 1-based) plus ``best.safetensors``.

Each checkpoint's safetensors metadata names the run that wrote it (``ember_train.run_id``, a random id minted
when a fresh run starts and kept by a resumed one). A run only ever rotates its own checkpoints, and a fresh run
refuses a folder that holds another run's checkpoints (:func:`claim_out_dir`) unless told to move them aside.
Checkpoints written before run ids existed have the id ``""``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ember import Tensor, records
from ember.device import Device
from ember.records import CorruptRecordError, IncompatibleStateError, LoadReport, RecordError

__all__ = [
    "FORMAT",
    "BEST_NAME",
    "LOG_NAMES",
    "InvalidCheckpointError",
    "RunConflictError",
    "new_run_id",
    "checkpoint_path",
    "checkpoint_run_id",
    "list_checkpoints",
    "latest_checkpoint",
    "run_files",
    "claim_out_dir",
    "save_checkpoint",
    "load_checkpoint",
    "check_model_state",
    "load_model_weights",
    "rotate_checkpoints",
    "deferred_sigint",
]

FORMAT = "ember_train.checkpoint/1"
BEST_NAME = "best.safetensors"
# the logs a run writes next to its checkpoints; moved aside with them by claim_out_dir(overwrite=True)
LOG_NAMES = ("metrics.jsonl", "metrics.csv", "curves.png")
_NAME = re.compile(r"^checkpoint-epoch(\d+)\.safetensors$")
_META_FORMAT, _META_EPOCH, _META_RUN, _META_SAVED = (
    "ember_train.format", "ember_train.epoch", "ember_train.run_id", "ember_train.saved_at")


class InvalidCheckpointError(CorruptRecordError):
    """A checkpoint's contents are not a valid training state (tampered, damaged or from another program).

    ``path`` is the file and ``key`` the offending entry (dotted, e.g. ``optimizer.param_groups[0].lr``).
    """

    def __init__(self, message: str, path: str = "", key: str = "") -> None:
        super().__init__(message)
        self.path, self.key = path, key


class RunConflictError(RecordError, FileExistsError):
    """The output folder holds checkpoints of another run; ``paths`` lists them, ``out_dir`` is the folder."""

    def __init__(self, message: str, out_dir: str, paths: list[str], resuming: bool) -> None:
        RecordError.__init__(self, message)
        self.out_dir, self.paths, self.resuming = out_dir, paths, resuming

    def __str__(self) -> str:  # FileExistsError would otherwise format (errno, strerror)
        return str(self.args[0])


def new_run_id() -> str:
    """A fresh random run id (16 hex digits)."""
    return secrets.token_hex(8)


def checkpoint_path(out_dir: str | os.PathLike[str], epoch: int) -> str:
    """``out_dir/checkpoint-epoch{epoch}.safetensors``."""
    return os.path.join(os.fspath(out_dir), f"checkpoint-epoch{epoch}.safetensors")


def _metadata(path: str) -> dict[str, str] | None:
    """The file's ember-train metadata, or None when it is unreadable or not an ember-train checkpoint."""
    try:
        meta = records.read_metadata(path)
    except (RecordError, OSError):
        return None
    return meta if meta.get(_META_FORMAT) == FORMAT else None


def checkpoint_run_id(path: str | os.PathLike[str]) -> str | None:
    """The id of the run that wrote this checkpoint ("" for checkpoints older than run ids; None when the file is
    not a readable ember-train checkpoint)."""
    meta = _metadata(os.fspath(path))
    return None if meta is None else meta.get(_META_RUN, "")


def _saved_at(path: str, meta: Mapping[str, str]) -> float:
    try:
        return float(meta[_META_SAVED])
    except (KeyError, ValueError):
        return os.path.getmtime(path)  # checkpoints older than the stamp


def _scan(out_dir: str) -> list[tuple[int | None, str, str | None, float]]:
    """``(epoch or None for best, path, run id or None if unreadable, saved-at)`` of every checkpoint file."""
    if not os.path.isdir(out_dir):
        return []
    found = []
    for name in sorted(os.listdir(out_dir)):
        m = _NAME.match(name)
        if not m and name != BEST_NAME:
            continue
        path = os.path.join(out_dir, name)
        meta = _metadata(path)
        run = None if meta is None else meta.get(_META_RUN, "")
        when = 0.0 if meta is None else _saved_at(path, meta)
        found.append((int(m.group(1)) if m else None, path, run, when))
    return found


def list_checkpoints(out_dir: str | os.PathLike[str], run_id: str | None = None) -> list[tuple[int, str]]:
    """``[(epoch, path), ...]`` of the epoch checkpoints in ``out_dir``, oldest first (empty if none).

    With ``run_id`` only that run's checkpoints are listed (files that are not readable checkpoints never are).
    """
    d = os.fspath(out_dir)
    if run_id is None:
        if not os.path.isdir(d):
            return []
        return sorted((int(m.group(1)), os.path.join(d, n)) for n in os.listdir(d) if (m := _NAME.match(n)))
    return sorted((e, p) for e, p, r, _ in _scan(d) if e is not None and r == run_id)


def _newest_run(out_dir: str) -> str | None:
    """The run whose epoch checkpoint was written last (None when the folder holds none)."""
    found = [(when, r) for e, _, r, when in _scan(out_dir) if e is not None and r is not None]
    return max(found)[1] if found else None


def latest_checkpoint(out_dir: str | os.PathLike[str], run_id: str | None = None) -> str | None:
    """Path of the newest epoch checkpoint of ``run_id`` in ``out_dir`` (None if there is none).

    Without ``run_id``: the highest epoch of the run that wrote the most recent checkpoint, so a folder holding
    several runs' files resumes the last run, never an older run's higher epoch numbers.
    """
    d = os.fspath(out_dir)
    run = run_id if run_id is not None else _newest_run(d)
    if run is None:
        return None
    found = list_checkpoints(d, run)
    return found[-1][1] if found else None


def run_files(out_dir: str | os.PathLike[str]) -> dict[str | None, list[str]]:
    """The checkpoint files of ``out_dir`` (epoch checkpoints and best) grouped by run id (None: unreadable)."""
    out: dict[str | None, list[str]] = {}
    for _, path, run, _ in _scan(os.fspath(out_dir)):
        out.setdefault(run, []).append(path)
    return out


def _aside_dir(out_dir: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(out_dir, f"replaced-{stamp}"), 1
    while os.path.exists(path):
        path, n = os.path.join(out_dir, f"replaced-{stamp}-{n}"), n + 1
    return path


def claim_out_dir(out_dir: str | os.PathLike[str], run_id: str | None, *, overwrite: bool = False,
                  op: str = "Learner.fit", dry_run: bool = False) -> list[str]:
    """Make sure ``out_dir`` holds no checkpoint of a run other than ``run_id`` (None: a fresh run, so any).

    Other runs' checkpoints (and, when the folder holds none of ``run_id``'s, their metric logs) raise
    :class:`RunConflictError`, or with ``overwrite=True`` are moved into ``out_dir/replaced-<date>-<time>/`` (never
    deleted). Returns the paths moved aside (with ``dry_run``: the paths that would be; nothing moves).
    """
    d = os.fspath(out_dir)
    groups = run_files(d)
    foreign = sorted(p for r, paths in groups.items() if r is None or r != run_id for p in paths)
    if not foreign:
        return []
    names = ", ".join(os.path.basename(p) for p in foreign[:4]) + (", ..." if len(foreign) > 4 else "")
    if not overwrite:
        what = ("also holds checkpoints of another run" if run_id is not None
                else "already holds checkpoints of another run")
        fix = ("pass overwrite=True to move the other run's files aside, or use another out_dir"
               if run_id is not None else
               'pass resume="latest" to continue that run, overwrite=True to move its files aside (into '
               f"{os.path.join(d, 'replaced-<date>-<time>')}), or use another out_dir")
        raise RunConflictError(f"{op}: output folder {d!r} {what} ({names}); {fix}", d, foreign,
                               resuming=run_id is not None)
    moving = list(foreign)
    if run_id is None or run_id not in groups:  # the logs describe the replaced run, not this one
        moving += [p for p in (os.path.join(d, n) for n in LOG_NAMES) if os.path.isfile(p)]
    if dry_run:
        return moving
    aside = _aside_dir(d)
    try:
        os.makedirs(aside)
        for p in moving:
            os.replace(p, os.path.join(aside, os.path.basename(p)))
    except OSError as e:
        raise RecordError(f"{op}: cannot move the other run's files in {d!r} aside into {aside!r} "
                          f"({type(e).__name__}: {e.strerror or e})") from e
    return moving


def rotate_checkpoints(out_dir: str | os.PathLike[str], keep_last: int | None, run_id: str) -> list[str]:
    """Delete all but the newest ``keep_last`` epoch checkpoints of run ``run_id`` (None keeps all); returns the
    deleted paths.

    Checkpoints of other runs, files that are not readable checkpoints and ``best.safetensors`` are never touched.
    """
    if keep_last is None:
        return []
    found = list_checkpoints(out_dir, run_id)
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


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any], run_id: str = "") -> None:
    """Write a checkpoint record atomically (Ctrl-C waits until the file is complete), stamped with ``run_id``."""
    meta = {_META_FORMAT: FORMAT, _META_EPOCH: str(state.get("epoch", "")), _META_RUN: run_id,
            _META_SAVED: f"{time.time():.6f}"}
    with deferred_sigint():
        records.save(dict(state), path, metadata=meta)


def load_checkpoint(path: str | os.PathLike[str], device: Any = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on ``device``, host ``flex`` by default).

    Unreadable files raise ``CorruptRecordError``; a record that is not an ember-train checkpoint, or whose
    ``model`` entry is not a state dict of tensors, raises RecordError / InvalidCheckpointError naming the file.
    """
    p = os.fspath(path)
    state = records.load(p, device=device if device is not None else Device.flex())
    if not isinstance(state, dict) or state.get("format") != FORMAT or "model" not in state:
        raise RecordError(f"load_checkpoint: {p!r} is not an ember-train checkpoint (no {FORMAT!r} record); "
                          "for plain weights use records.load_into(model, path)")
    model = state["model"]
    if not isinstance(model, Mapping):
        raise InvalidCheckpointError(f"load_checkpoint: {p!r}: 'model' is a {type(model).__name__}, not a state "
                                     "dict of tensors", p, "model")
    for k, v in model.items():
        if not isinstance(k, str) or not isinstance(v, Tensor):
            raise InvalidCheckpointError(f"load_checkpoint: {p!r}: model entry {k!r} is a {type(v).__name__}, not "
                                         "a tensor", p, f"model.{k}")
    return state


def _kind(t: Tensor) -> str:
    d = t.dtype
    return "bool" if d.is_bool else "floating" if d.is_floating_point else "integer" if d.is_integer else d.name


def check_model_state(model: Any, state: Mapping[str, Tensor], path: str) -> LoadReport:
    """Compare a checkpoint's model state with ``model`` without changing it: every value must be a tensor of the
    parameter's shape and kind of dtype (floating, integer, bool). Missing, unexpected and mismatched keys raise
    IncompatibleStateError naming every bad key; a wrong type or dtype kind raises InvalidCheckpointError."""
    if not isinstance(state, Mapping):
        raise InvalidCheckpointError(f"checkpoint {path!r}: 'model' is a {type(state).__name__}, not a state dict",
                                     path, "model")
    for k, v in state.items():
        if not isinstance(v, Tensor):
            raise InvalidCheckpointError(f"checkpoint {path!r}: model entry {k!r} is a {type(v).__name__}, not a "
                                         "tensor", path, f"model.{k}")
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
    for k, target in own.items():
        if _kind(state[k]) != _kind(target):
            raise InvalidCheckpointError(
                f"checkpoint {path!r}: model entry {k!r} has dtype {state[k].dtype}, but the model's is "
                f"{target.dtype} ({_kind(target)} expected)", path, f"model.{k}")
    return report


def load_model_weights(model: Any, path: str | os.PathLike[str]) -> LoadReport:
    """Load model weights from an ember-train checkpoint or a plain state-dict record (for inference)."""
    p = os.fspath(path)
    meta = records.read_metadata(p)
    if meta.get(_META_FORMAT) != FORMAT:
        return records.load_into(model, p)
    state = load_checkpoint(p)["model"]
    report = check_model_state(model, state, p)
    model.load_state_dict(state)
    return report
