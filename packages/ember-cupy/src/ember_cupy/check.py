"""``ember kernels check --target cuda|hip``: compile every kernel program the GPU backends can emit.

Each program of :mod:`ember_cupy.catalog` is turned into the target's text by its dialect
(:mod:`ember_kernels.dialect`) and compiled with NVRTC (cuda), or hiprtc (hip) -- else clang's HIP compiler where
hiprtc is absent (:class:`ember_cupy.rtc.ClangHIP`) -- no GPU or driver needed. The
command prints ``N compiled, M failed`` and, for each failure, the program's name, the compiler log and the
numbered source; it exits 1 when any program failed, 0 when all compiled, and 0 with a ``skipped:`` line naming the
reason when the target's compiler cannot be loaded here (``--require`` turns that into exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from ember_kernels import dialect

from . import catalog, rtc


def _numbered(source: str) -> str:
    return "\n".join(f"{i:5d}  {line}" for i, line in enumerate(source.splitlines(), 1))


def run_check(target: str, arch: str | None = None, areas: list[str] | None = None, require: bool = False,
              max_shown: int = 5, out: TextIO | None = None) -> int:
    """Compile the catalogue for ``target``; returns the exit status (see the module docstring)."""
    out = out or sys.stdout
    lang = dialect(target)
    try:
        comp = rtc.compiler(target, arch)
    except rtc.Unavailable as exc:
        print(f"ember kernels check --target {target}: skipped: {exc}", file=out)
        return 2 if require else 0
    started = time.perf_counter()
    ok = 0
    failed: list[tuple[str, str, str]] = []
    warned = 0
    programs = [(name, lang.program(source), lang.options(source)) for name, source in catalog.all_sources(areas)]
    batch = getattr(comp, "compile_many", None)
    if batch is not None:  # one compiler process per options set (clang): start-up and header parsing paid once
        by_options: dict[tuple[str, ...], list[int]] = {}
        for i, (_, _, extra) in enumerate(programs):
            by_options.setdefault(extra, []).append(i)
        results: list[rtc.Result | None] = [None] * len(programs)
        for extra, members in by_options.items():
            for i, res in zip(members, batch([(programs[i][1], programs[i][0]) for i in members], extra)):
                results[i] = res
    else:
        results = [comp.compile(program, name, extra) for name, program, extra in programs]
    for (name, program, _), res in zip(programs, results):
        assert res is not None
        if res.ok:
            ok += 1
            warned += bool(res.log)
        else:
            failed.append((name, res.log, program))
    for name, log, program in failed[:max_shown]:
        print(f"--- FAILED {name} ({target}, {comp.version})\n{log}\n--- source of {name}:\n{_numbered(program)}\n",
              file=out)
    if len(failed) > max_shown:
        print(f"... and {len(failed) - max_shown} more failures:", file=out)
        for name, log, _ in failed[max_shown:]:
            first = next((ln for ln in log.splitlines() if "error" in ln), log.splitlines()[0] if log else "")
            print(f"    {name}: {first}", file=out)
    took = time.perf_counter() - started
    print(f"ember kernels check --target {target} ({comp.version}, {comp.options_text}): {ok} compiled, "
          f"{len(failed)} failed"
          + (f" ({warned} with warnings)" if warned else "") + f" in {took:.1f} s", file=out)
    return 1 if failed else 0


def _command(args: argparse.Namespace) -> int:
    if args.kernels_command == "list":
        for name, _ in catalog.all_sources(args.area or None):
            print(name)
        return 0
    return run_check(args.target, args.arch, args.area or None, args.require, args.show)


def register_kernels(sub: Any) -> None:
    """The ``ember kernels`` command (entry-point group ``ember.commands``): ``check`` and ``list``."""
    p = sub.add_parser("kernels", help="compile the GPU backends' kernels without a GPU (NVRTC / hiprtc / clang)",
                       description=__doc__.split("\n\n")[0])
    ksub = p.add_subparsers(dest="kernels_command", required=True)
    c = ksub.add_parser("check", help="generate every kernel program and compile it for a target")
    c.add_argument("--target", choices=("cuda", "hip"), required=True)
    c.add_argument("--arch", default=None, help=f"virtual architecture or gfx target (default "
                                                f"{rtc.DEFAULT_CUDA_ARCH} / {rtc.DEFAULT_HIP_ARCH})")
    c.add_argument("--area", action="append", choices=sorted(catalog.AREAS),
                   help="only these kernel areas (repeatable; default all)")
    c.add_argument("--require", action="store_true", help="exit 2 instead of skipping when the compiler is missing")
    c.add_argument("--show", type=int, default=5, metavar="N", help="print source and log of the first N failures")
    c.set_defaults(func=_command)
    lst = ksub.add_parser("list", help="list the catalogued kernel programs")
    lst.add_argument("--area", action="append", choices=sorted(catalog.AREAS))
    lst.set_defaults(func=_command)
