"""Errors specific to the OpenCL backend.

:class:`KernelBuildError` is raised when the OpenCL compiler rejects a generated kernel. Its message is meant to be
read by a person debugging a code generator: it names the kernel(s), the device and the build options, shows the
generated source around every line the build log complains about (with line numbers and a marker), then the build log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ember.errors import EmberError

# Lines of source shown before and after each error line; errors whose windows overlap share one excerpt.
_CONTEXT = 3
# At most this many error locations get an excerpt; the build log lists the rest.
_MAX_LOCATIONS = 6
# Shown when the log names no line (e.g. a rejected build option or a driver crash).
_FALLBACK_LINES = 40
# Build logs can be thousands of lines (one bad macro, many errors); the head is what matters.
_MAX_LOG_LINES = 150

# Error locations in the build logs of the common OpenCL compilers. Each pattern yields `line` and optionally `col`
# and `msg`. Only errors are located (warnings are noise for this purpose); the first match on a log line wins.
_LOCATION_PATTERNS: tuple[re.Pattern[str], ...] = (
    # PoCL (clang front end): "error: /home/u/.cache/pocl/kcache/tempfile_Ab12.cl:3:10: use of undeclared identifier"
    re.compile(r"\b(?:fatal\s+)?error:\s*[^\s:]*:(?P<line>\d+):(?P<col>\d+):\s*(?P<msg>.*)$"),
    # clang style, used by NVIDIA ("<kernel>:3:10: error: ..."), ROCm ("/tmp/comgr-x/input/CompileSource:3:10: error:"),
    # Intel ("1:3:10: error: ..."), Mesa ("input.cl:3:10: error: ...") and others ("<source>:3:10: error: ...").
    re.compile(r"(?:^|[\s\"'(])[^\s:\"']*:(?P<line>\d+):(?P<col>\d+):\s*(?:fatal\s+)?error\b:?\s*(?P<msg>.*)$"),
    # EDG style (legacy AMD APP SDK, some embedded compilers): '"/tmp/OCL1234.cl", line 3: error: ...'
    re.compile(r"\bline\s+(?P<line>\d+):\s*(?:catastrophic\s+)?error\b:?\s*(?P<msg>.*)$"),
    # Line without column: "<source>:3: error: ..."
    re.compile(r"(?:^|[\s\"'(])[^\s:\"']*:(?P<line>\d+):\s*(?:fatal\s+)?error\b:?\s*(?P<msg>.*)$"),
)

_KERNEL_NAME = re.compile(r"\b(?:__kernel|kernel)\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+(\w+)\s*\(", re.S)


class KernelBuildError(EmberError, RuntimeError):
    """The OpenCL compiler rejected a kernel program.

    Construct it with :meth:`from_build_log`; the plain constructor takes a finished message (so that the error
    pickles). The parts are kept as attributes: ``source``, ``build_log``, ``device``, ``kernel_names``,
    ``options`` and ``error_lines`` (1-based source lines the log complains about).
    """

    source: str = ""
    build_log: str = ""
    device: str = ""
    kernel_names: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    error_lines: tuple[int, ...] = ()

    @classmethod
    def from_build_log(
        cls,
        source: str,
        build_log: str,
        *,
        device: str,
        kernel_names: Sequence[str] = (),
        options: Sequence[str] = (),
        program: str = "",
    ) -> KernelBuildError:
        """Build the error from the generated ``source`` and the compiler's ``build_log``.

        ``device`` is a human-readable device description, ``kernel_names`` the kernels the caller asked for (the
        kernels the source defines are added), ``program`` an id for the program (e.g. its cache hash).
        """
        names = list(dict.fromkeys([*kernel_names, *_KERNEL_NAME.findall(source)]))
        locations = parse_error_locations(build_log)
        msg = format_build_error(
            source, build_log, device=device, kernel_names=names, options=options, program=program, locations=locations
        )
        err = cls(msg)
        err.source = source
        err.build_log = build_log
        err.device = device
        err.kernel_names = tuple(names)
        err.options = tuple(options)
        err.error_lines = tuple(dict.fromkeys(line for line, _, _ in locations))
        return err


def parse_error_locations(build_log: str) -> list[tuple[int, int | None, str]]:
    """Return ``(line, column or None, message)`` for every error the build log locates, in log order."""
    found: list[tuple[int, int | None, str]] = []
    for log_line in build_log.splitlines():
        for pattern in _LOCATION_PATTERNS:
            m = pattern.search(log_line)
            if m is None:
                continue
            groups = m.groupdict()
            col = int(groups["col"]) if groups.get("col") else None
            found.append((int(groups["line"]), col, (groups.get("msg") or "").strip()))
            break
    return found


def format_build_error(
    source: str,
    build_log: str,
    *,
    device: str,
    kernel_names: Sequence[str] = (),
    options: Sequence[str] = (),
    program: str = "",
    locations: Sequence[tuple[int, int | None, str]] | None = None,
) -> str:
    """Format the message of a :class:`KernelBuildError` (see the module docstring for the layout)."""
    if locations is None:
        locations = parse_error_locations(build_log)
    src_lines = source.splitlines()
    width = len(str(max(len(src_lines), 1)))

    what = ", ".join(repr(n) for n in kernel_names) if kernel_names else "(no kernel found in the source)"
    head = f"OpenCL build failed for kernel(s) {what}"
    if program:
        head += f" (program {program})"
    head += f" on device {device}"
    parts = [head, f"build options: {' '.join(options) if options else '(none)'}"]

    # First location per line (one caret per line keeps the excerpt readable); lines past the end are dropped --
    # they come from headers or driver preambles, not from our source.
    by_line: dict[int, tuple[int | None, str]] = {}
    for line, col, msg in locations:
        if 1 <= line <= len(src_lines) and line not in by_line:
            by_line[line] = (col, msg)
    shown = sorted(by_line)[:_MAX_LOCATIONS]

    def numbered(i: int, mark: bool) -> str:
        return f"{'>>' if mark else '  '} {i:>{width}} | {src_lines[i - 1]}"

    excerpt: list[str] = []
    if shown:
        n = len(by_line)
        excerpt.append(f"generated source around the error line(s) {', '.join(map(str, shown))}"
                       + (f" ({n - len(shown)} more in the log)" if n > len(shown) else "") + ":")
        # Merge overlapping windows so each source line is printed once.
        windows: list[list[int]] = []
        for line in shown:
            lo, hi = max(1, line - _CONTEXT), min(len(src_lines), line + _CONTEXT)
            if windows and lo <= windows[-1][1] + 1:
                windows[-1][1] = max(windows[-1][1], hi)
            else:
                windows.append([lo, hi])
        for k, (lo, hi) in enumerate(windows):
            if k:
                excerpt.append(f"   {' ' * width} | ...")
            for i in range(lo, hi + 1):
                excerpt.append(numbered(i, i in by_line))
                if i in by_line:
                    col, msg = by_line[i]
                    pad = " " * (col - 1) if col and col <= len(src_lines[i - 1]) + 1 else ""
                    excerpt.append(f"   {' ' * width} | {pad}^ {msg}".rstrip())
    elif src_lines:
        n = min(len(src_lines), _FALLBACK_LINES)
        excerpt.append(f"the build log names no source line; first {n} of {len(src_lines)} generated source lines:")
        excerpt.extend(numbered(i, False) for i in range(1, n + 1))
    else:
        excerpt.append("(the generated source is empty)")
    parts.append("\n".join(excerpt))

    log_lines = build_log.strip().splitlines() or ["(empty)"]
    if len(log_lines) > _MAX_LOG_LINES:
        log_lines = [*log_lines[:_MAX_LOG_LINES], f"... ({len(log_lines) - _MAX_LOG_LINES} more lines)"]
    parts.append("build log:\n" + "\n".join(f"  {s}".rstrip() for s in log_lines))
    return "\n".join(parts)


class AutotuneError(EmberError, RuntimeError):
    """Every candidate configuration of an autotuned kernel failed on this device."""


__all__ = ["AutotuneError", "KernelBuildError", "format_build_error", "parse_error_locations"]
