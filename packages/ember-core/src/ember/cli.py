"""The ``ember`` command: ``ember info [--json]``, ``ember bench [...]``, ``ember --version``.

Errors are reported in one or two lines naming the problem and the fix; ``--debug`` (or ``EMBER_DEBUG=1``) shows
the traceback instead.

Benchmarks are registered by the packages that ship them, through the entry-point group ``ember.benchmarks``: the
entry point's name is what ``ember bench NAME`` takes, and it refers to a mapping
``{"description": str, "script": str}``. A relative ``script`` is a file of the source checkout's ``benchmarks/``
folder (beside the working directory or the checkout holding this file); an absolute one is used as it is. The
script's ``main(argv) -> int`` runs the benchmark. Core names no benchmark's package; plain ``ember bench`` runs
the benchmark named ``suite``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    """Plain-text columns (rich is not a dependency)."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def format_info(info: dict[str, Any]) -> str:
    """The human-readable ``ember info`` report."""
    lines = [
        f"ember {info['ember']} (backend contract {info['contract']})",
        f"python {info['python']} ({info['implementation']}), numpy {info['numpy']}, {info['platform']}",
        f"default device: {info['default_device'] or 'none'}"
        + (f" ({info['default_device_error']})" if info.get("default_device_error") else ""),
        "",
    ]
    plugins = info["plugins"]
    lines.append(f"plugins ({len(plugins)}):")
    if plugins:
        rows = [
            [p["name"], p["distribution"] or "-", p["version"] or "-", p["module"],
             "error" if p["error"] else "conflict" if p.get("conflicts") else "ok"]
            for p in plugins
        ]
        lines += _table(rows, ["NAME", "DISTRIBUTION", "VERSION", "MODULE", "STATUS"])
    else:
        from .plugins.manager import missing_backend_hint

        lines.append(f"  none ({missing_backend_hint()})")

    backends = info["backends"]
    lines += ["", f"backends ({len(backends)}):"]
    if backends:
        rows = [
            [b["name"], b["kind"], str(b["priority"]), str(b["contract"]), str(b["devices"]), b["plugin"],
             b["description"]]
            for b in backends
        ]
        lines += _table(rows, ["NAME", "KIND", "PRIORITY", "CONTRACT", "DEVICES", "PLUGIN", "DESCRIPTION"])
    else:
        lines.append("  none")

    decorators = info["decorators"]
    lines += ["", f"decorators ({len(decorators)}):"]
    if decorators:
        rows = [[d["name"], str(d["contract"]), d["plugin"], d["description"]] for d in decorators]
        lines += _table(rows, ["NAME", "CONTRACT", "PLUGIN", "DESCRIPTION"])
    else:
        lines.append("  none")

    ops = info["ops"]
    lines += ["", f"extension ops ({len(ops)}):"]
    if ops:
        rows = [[o["name"], ",".join(o["backends"]) or "-", o["plugin"], o["description"]] for o in ops]
        lines += _table(rows, ["NAME", "FAST PATHS", "PLUGIN", "DESCRIPTION"])
    else:
        lines.append("  none")

    facts = info["plugin_info"]
    if facts:
        lines += ["", "plugin info:"]
        for name, value in facts.items():
            if isinstance(value, dict):
                text = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
            else:
                text = str(value)
            lines.append(f"  {name}: {text}")

    conflicts = info.get("conflicts") or []
    if conflicts:
        lines += ["", f"name conflicts ({len(conflicts)}):"]
        rows = [[c["what"], c["name"], c["winner"], c["loser"], c["reason"]] for c in conflicts]
        lines += _table(rows, ["WHAT", "NAME", "KEPT FROM", "DROPPED FROM", "WHY"])

    errors = info["errors"]
    lines += ["", f"load errors ({len(errors)}):" if errors else "load errors: none"]
    lines += [f"  {e}" for e in errors]
    return "\n".join(lines)


BENCHMARK_GROUP = "ember.benchmarks"
#: what plain ``ember bench`` runs
_SUITE = "suite"


def _benchmark_names() -> list[str]:
    """The registered benchmark names, without loading anything (for help texts)."""
    from importlib import metadata

    return sorted({ep.name for ep in metadata.entry_points(group=BENCHMARK_GROUP)})


def _benchmark(name: str) -> dict[str, str] | None:
    """The registration of benchmark ``name`` (description and script), or None when no package registers it.

    A registration that fails to load or is not a mapping with a ``description`` is a :class:`PluginError` naming
    the entry point: ``ember bench`` must not run something other than what was asked for."""
    from importlib import metadata

    from .errors import PluginError

    eps = sorted((ep for ep in metadata.entry_points(group=BENCHMARK_GROUP) if ep.name == name),
                 key=lambda ep: ep.value)
    if not eps:
        return None
    ep = eps[0]
    try:
        spec = ep.load()
    except Exception as exc:
        raise PluginError(f"benchmark {name!r} ({ep.value}, entry-point group {BENCHMARK_GROUP}) failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("description"), str):
        raise PluginError(f"benchmark {name!r} ({ep.value}): expected a dict with a 'description' and a 'script', "
                          f"got {type(spec).__name__}")
    return {"description": spec["description"], "script": str(spec.get("script") or f"{name}.py")}


class _RegisteredBenchmarks(Mapping[str, str]):
    """The registered benchmarks as a read-only mapping name -> description, read from the entry points on each
    use (names without loading anything; a description loads that one registration)."""

    def __getitem__(self, name: str) -> str:
        spec = _benchmark(name)
        if spec is None:
            raise KeyError(name)
        return spec["description"]

    def __iter__(self) -> Iterator[str]:
        return iter(_benchmark_names())

    def __len__(self) -> int:
        return len(_benchmark_names())

    def __contains__(self, name: object) -> bool:
        return name in _benchmark_names()


_BENCHMARKS: Mapping[str, str] = _RegisteredBenchmarks()


def _script_path(script: str) -> Path | None:
    """A registered script: absolute as is; relative under benchmarks/ beside the cwd or the checkout (benchmark
    scripts live in the source tree, not in the wheels)."""
    path = Path(script)
    if path.is_absolute():
        return path if path.is_file() else None
    here = Path(__file__).resolve()
    # src/ember/cli.py -> packages/ember-core/src/ember: the checkout root is four levels above the package
    candidates = [Path.cwd() / "benchmarks" / path]
    if len(here.parents) > 4:
        candidates.append(here.parents[4] / "benchmarks" / path)
    return next((p for p in candidates if p.is_file()), None)


def _find_benchmark(name: str) -> Path | None:
    """The script of the registered benchmark ``name``, or None when it is not registered or not found."""
    spec = _benchmark(name)
    return None if spec is None else _script_path(spec["script"])


def _find_overhead_benchmark() -> Path | None:
    """benchmarks/overhead.py (`ember bench overhead`), or None."""
    return _find_benchmark("overhead")


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"ember_bench_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered while it executes
    spec.loader.exec_module(mod)
    return mod


def _cmd_info(args: argparse.Namespace) -> int:
    from ._info import collect

    info = collect()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=False))
    else:
        print(format_info(info))
    # under EMBER_STRICT_PLUGINS=1 a plugin that failed (import, hooks, contract, name conflict, plugin_info) is a
    # failure of the installation (CI checks this); a bad EMBER_DEVICE alone is reported but is not a plugin's
    failed = [e for e in info["errors"] if not e.startswith("default device:")]
    return 1 if info.get("strict") and failed else 0


def _cmd_bench(args: argparse.Namespace) -> int:
    bench_args = list(args.bench_args)
    names = _benchmark_names()
    # `ember bench NAME ...` runs the benchmark NAME; options alone run the suite
    if bench_args[:1] and not bench_args[0].startswith("-"):
        name, bench_args = bench_args[0], bench_args[1:]
    else:
        name = _SUITE
    spec = _benchmark(name)
    if spec is None:
        print(f"ember bench: no installed package registers a benchmark {name!r} (entry-point group "
              f"{BENCHMARK_GROUP}; registered: {', '.join(names) or 'none'})", file=sys.stderr)
        return 2
    print(f"ember bench {name}: {spec['description']}")
    if name == _SUITE:
        print(f"(`ember bench {'|'.join(n for n in names if n != _SUITE)}` run single benchmarks)")
    path = _find_overhead_benchmark() if name == "overhead" else _find_benchmark(name)
    if path is None:
        where = spec["script"] if Path(spec["script"]).is_absolute() else f"benchmarks/{spec['script']}"
        print(
            f"ember bench: {where} was not found (it ships with the source checkout, not the wheel); "
            "run it from the repository root.",
            file=sys.stderr,
        )
        return 2
    return int(_load_module(path).main(bench_args) or 0)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="ember", description="ember: plugins, devices and benchmarks.")
    parser.add_argument("--version", action="version", version=f"ember {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also EMBER_DEBUG=1); works after a command too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p_info = sub.add_parser("info", help="plugins, versions, contract versions, devices found and load errors")
    p_info.add_argument("--json", action="store_true", help="machine-readable output")
    p_info.set_defaults(func=_cmd_info)

    names = "|".join(_benchmark_names()) or "NAME"
    p_bench = sub.add_parser(
        "bench",
        help=f"the benchmark suite versus PyTorch (benchmarks/suite.py); `ember bench {names}` runs one script",
        description="The full benchmark suite (seed CNN and transformer training and inference, micro-benchmarks, "
        "peak memory) versus PyTorch. Extra arguments (--quick, --json PATH, --only SECTION...) pass through to "
        f"benchmarks/suite.py. `ember bench {names} [--quick] [--json PATH]` runs that benchmark script instead. "
        f"Installed packages register their benchmarks through the entry-point group {BENCHMARK_GROUP}.",
    )
    p_bench.set_defaults(func=_cmd_bench)
    _add_package_commands(sub)
    return parser


# Commands that installed packages contribute, and what to install when one is missing; the table only says where
# a command comes from, the command itself is always the package's (through its entry point).
_PACKAGE_COMMANDS = {
    "train": ("ember-train", "train a built-in example (needs ember-train)"),
}


def _add_package_commands(sub: Any) -> None:
    """Subcommands contributed by installed packages through the ``ember.commands`` entry-point group: each
    entry point is a callable ``register(subparsers)`` that adds its parser and sets ``func`` (as ember-train
    does for ``ember train``). A package whose command fails to load is reported, not fatal. A known command
    whose package is missing gets a stand-in that says what to install."""
    from importlib import metadata

    loaded: set[str] = set()
    for ep in metadata.entry_points(group="ember.commands"):
        try:
            ep.load()(sub)
            loaded.add(ep.name)
        except Exception as exc:  # a broken package must not take `ember info` down with it
            print(f"ember: command {ep.name!r} from {ep.value} failed to load: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
    for name, (dist, help_text) in _PACKAGE_COMMANDS.items():
        if name not in loaded and name not in sub.choices:
            p = sub.add_parser(name, help=help_text, add_help=False)
            p.set_defaults(func=_missing_command(name, dist), takes_any_arguments=True)


def _missing_command(name: str, dist: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        print(f"ember {name}: this command comes from the {dist} package, which is not installed (or failed to "
              f"load);\n  install it with pip install {dist} (or pip install ember, which includes it)",
              file=sys.stderr)
        return 2

    return run


def _debugging(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("EMBER_DEBUG", "") not in ("", "0", "false", "no")


def _report(command: str, exc: BaseException) -> None:
    """One or two lines: what went wrong (typed ember errors already name the problem and the fix)."""
    from .errors import EmberError

    prefix = f"ember {command}" if command else "ember"
    if isinstance(exc, EmberError):
        print(f"{prefix}: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:  # not a user error: say so, and how to get the details for a bug report
        print(f"{prefix}: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
    print("  (run with --debug or EMBER_DEBUG=1 for the traceback)", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ember`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debugging(argv)
    # --debug is accepted anywhere (`ember train --debug ...`); the commands never see it
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    # `ember bench` hands its options to the benchmark script, which parses them itself
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench" and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.bench_args = extra
    args.debug = debug
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if debug:
        return args.func(args)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"ember {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        _report(args.command or "", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
