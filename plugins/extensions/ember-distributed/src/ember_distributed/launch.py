"""``ember launch -n N -- python train.py``: start N ranks through the installed ``mpiexec``.

MPICH's Hydra ``mpiexec`` (the ``mpich`` wheel, most clusters' MPICH / Intel MPI) runs with
``-disable-auto-cleanup``: when a rank dies the others are not killed by the launcher but raise
:class:`~ember_distributed.errors.DistributedTimeoutError` from their next collective after the group's timeout
(``--timeout``, passed on as ``EMBER_DIST_TIMEOUT``), so the failure is reported by every rank instead of a bare
signal (a rank that raises an uncaught exception aborts the job at once, see :func:`ember_distributed.init`).
Open MPI's ``mpiexec`` kills the job when a rank dies; ``--oversubscribe`` is added there when more ranks
than cores are asked for (MPICH oversubscribes by default). On Slurm use ``srun --mpi=pmix python train.py``
instead (see docs/plugins/distributed.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ember.errors import ValueRangeError

from .errors import DistributedError


def find_mpiexec(explicit: str | None = None) -> str:
    """The ``mpiexec`` to use: ``explicit``, ``$EMBER_MPIEXEC``, the one next to this Python (a venv with the
    ``mpich`` wheel) or the first on ``PATH``."""
    for cand in (explicit, os.environ.get("EMBER_MPIEXEC"), os.path.join(os.path.dirname(sys.executable), "mpiexec")):
        if cand and (os.path.isfile(cand) or shutil.which(cand)):
            return shutil.which(cand) or cand
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise DistributedError("ember launch: no mpiexec found; pip install mpich (an MPI from PyPI) or load the "
                               "cluster's MPI module (or pass --mpiexec PATH)")
    return found


def mpi_flavour(mpiexec: str) -> str:
    """``"mpich"`` (Hydra), ``"openmpi"`` or ``"unknown"``, from ``mpiexec --version``."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "HYDRA" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return "mpich"
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    return "unknown"


def build_command(nproc: int, command: Sequence[str], mpiexec: str | None = None,
                  flavour: str | None = None) -> list[str]:
    """The ``mpiexec`` command line that starts ``nproc`` copies of ``command``."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueRangeError(f"ember launch: -n must be a positive number of ranks, got {nproc!r}")
    cmd = [c for c in command]
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueRangeError("ember launch: give the command to run after --, e.g. ember launch -n 2 -- python "
                              "train.py")
    exe = find_mpiexec(mpiexec)
    kind = flavour or mpi_flavour(exe)
    args = [exe, "-n", str(nproc)]
    if kind == "mpich":
        args.append("-disable-auto-cleanup")  # survivors report the dead rank themselves (typed error, timeout)
    elif kind == "openmpi" and nproc > (os.cpu_count() or 1):
        args.append("--oversubscribe")
    return args + cmd


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--nproc", "--nproc-per-node", dest="nproc", type=int, default=2,
                   help="number of ranks (default 2)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a collective may wait before it raises DistributedTimeoutError (EMBER_DIST_TIMEOUT)")
    p.add_argument("--mpiexec", default=None, help="the mpiexec to use (default: $EMBER_MPIEXEC, the venv's, PATH)")
    p.add_argument("--dry-run", action="store_true", help="print the mpiexec command instead of running it")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the program and its arguments")


def run(args: argparse.Namespace) -> int:
    """Run the ranks; returns mpiexec's exit status."""
    cmd = build_command(args.nproc, args.command, args.mpiexec)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    env = dict(os.environ)
    if args.timeout is not None:
        if args.timeout <= 0:
            raise ValueRangeError(f"ember launch: --timeout must be positive seconds, got {args.timeout}")
        env["EMBER_DIST_TIMEOUT"] = str(args.timeout)
    return subprocess.call(cmd, env=env)


def register_launch(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``launch`` to core's ``ember`` subcommands (the ``ember.commands`` entry point)."""
    p = subparsers.add_parser("launch", help="run a program on N ranks through mpiexec (ember-distributed)",
                              description="Start N ranks of a program through the installed mpiexec: "
                              "ember launch -n 4 -- python train.py")
    _add_arguments(p)
    p.set_defaults(func=run, takes_any_arguments=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ember_distributed.launch -n 2 -- python train.py``."""
    p = argparse.ArgumentParser(prog="python -m ember_distributed.launch", description=__doc__.splitlines()[0])
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
