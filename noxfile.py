"""nox sessions for the ember monorepo.

    nox -l                      list sessions
    nox -s lint                 ruff
    nox -s core                 ember-core's own tests (with flex + autodiff, which they run on)
    nox -s core_flex            core + one plugin alone: the plugin's tests and (backends) the conformance kit
    nox -s router_kit           the conformance kit on flex+router(local) and flex+autodiff+router(local)
    nox -s all                  every package together, the cross-plugin tests in tests/
    nox -s docs                 the docs examples and the Sphinx build (warnings are errors, no network)
    nox -s bench_smoke          benchmarks/{overhead,autodiff,suite}.py --quick
    nox -s fuzz                 tests/fuzz with EMBER_FUZZ_EXAMPLES=70 (~20,000 cases per device; CI runs 3 per op)
    nox -s threads              tests/test_threads.py with EMBER_THREAD_SOAK=1 (the suite runs a short variant)

Sessions install from the checkout alone (every first-party package editable; torch==2.13.0 for the tests comes
from the machine's local wheels), so each one runs from a fresh clone; ``.ci/run`` proves it with ``nox -l`` and
``core_flex``. Posargs go to the session's main pytest run, e.g. ``nox -s core -- -x -k optim``.

A new plugin adds one line to PLUGINS (and one to the hatch workspace in pyproject.toml); it then gets its own
``core_<name>`` session and joins ``all``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PYTHON = "3.11"

nox.options.default_venv_backend = "venv"  # plain pip: torch==2.13.0 is installed from a local wheel
nox.options.reuse_venv = "yes"

CORE = "packages/ember-core"
META = "packages/ember"  # requires ember-train, so it is always installed together with TRAIN
TRAIN = "packages/ember-train[plot]"  # `plot`: the Learner's PNG curves are tested too
EXAMPLE_BACKEND = "tests/example-backend"  # a third-party-style plugin used by the cross-plugin tests
KERNELS = "packages/ember-kernels"  # the kernel generators OpenCL, CUDA and HIP share (a library, not a plugin)
CUPY = "packages/ember-cupy"  # the CuPy backend implementation ember-cuda and ember-rocm share
DEV_DOCS = ["sphinx", "pydata-sphinx-theme", "myst-parser"]

# CI semantics: a plugin that fails to load is an error, not a logged warning.
STRICT_ENV = {"EMBER_STRICT_PLUGINS": "1"}


@dataclass(frozen=True)
class Plugin:
    name: str  # extra / session name: core_<name>
    path: str  # directory holding the plugin's pyproject.toml
    device: str | None = None  # device to run the conformance kit on (backends); None: no kit run
    needs: tuple[str, ...] = ()  # other plugins its tests need installed (e.g. a decorator needs a backend)
    workers: int = 0  # pytest-xdist workers for its tests and kit run (0: none)
    libraries: tuple[str, ...] = ()  # first-party library packages it depends on (installed from the checkout)
    extras: str = ""  # its own extras to install, e.g. "[test]"
    commands: tuple[tuple[str, ...], ...] = ()  # extra commands its session runs after the tests


# core's own tests train small models: they need a backend and gradients
CORE_TEST_NEEDS = ("flex", "autodiff")


# One line per first-party plugin.
PLUGINS: list[Plugin] = [
    Plugin("flex", "plugins/backends/ember-flex", device="flex"),
    Plugin("autodiff", "plugins/decorators/ember-autodiff", device="flex+autodiff", needs=("flex",)),
    # needs an OpenCL platform: scripts/setup.sh installs PoCL (CPU OpenCL) when none is present; its tests check
    # that a CPU OpenCL runtime is never preferred over flex, so flex is installed beside it
    # two workers, as in scripts/test.sh: a cold start (empty kernel caches) is bound by single-threaded compiles
    Plugin("opencl", "plugins/backends/ember-opencl", device="opencl", needs=("flex",), workers=2,
           libraries=(KERNELS,)),
    # an automatic decorator: with it installed, flex is fused, so the kit on "flex" runs through it; its tests
    # also check fused training steps and device strings under autodiff
    Plugin("fusion", "plugins/decorators/ember-fusion", device="flex", needs=("flex", "autodiff")),
    # an extension on nn modules: no device of its own (no kit run); its tests train on flex+autodiff
    Plugin("lora", "plugins/extensions/ember-lora", needs=("flex", "autodiff")),
    # WebGPU; on machines without a GPU, Mesa's lavapipe (CPU Vulkan, installed by scripts/setup.sh as root)
    # two workers as OpenCL: a kit test's time is mostly Python (oracle, dispatch, submits), not lavapipe's shaders
    Plugin("wgpu", "plugins/backends/ember-wgpu", device="wgpu", needs=("flex",), workers=2),
    # no GPU here: the kernels are compiled with NVRTC (hiprtc where it loads) and the CuPy calls checked by name
    Plugin("cuda", "plugins/backends/ember-cuda", needs=("flex",), libraries=(KERNELS, CUPY), extras="[nvrtc]",
           commands=(("ember", "kernels", "check", "--target", "cuda"),)),
    Plugin("rocm", "plugins/backends/ember-rocm", needs=("flex",), libraries=(KERNELS, CUPY),
           commands=(("ember", "kernels", "check", "--target", "hip"),)),
    # a decorator; the kit on flex+router(local) is the router_kit session (minutes: not in every run)
    Plugin("router", "plugins/decorators/ember-router", needs=("flex", "autodiff")),
    # `ember serve` and Device.remote(url): its tests run a server on 127.0.0.1 (TLS, tokens, malformed frames);
    # then the conformance kit on remote, against an `ember serve` subprocess on a free loopback port
    Plugin("remote", "plugins/backends/ember-remote", needs=("flex", "autodiff"), extras="[init]",
           commands=(("python", "-m", "ember_remote.kit", "-p", "no:cacheprovider", "-q"),)),
    # extensions publishing ember.linalg.*, ember.fft/ember.stft/ember.signal, ember_onnx, ember.distributed: no
    # device of their own; their tests run on flex, flex+autodiff, fused flex (and toy/OpenCL where installed)
    Plugin("linalg", "plugins/extensions/ember-linalg", needs=("flex", "autodiff", "fusion")),
    Plugin("signal", "plugins/extensions/ember-signal", needs=("flex", "autodiff", "fusion")),
    Plugin("onnx", "plugins/extensions/ember-onnx", needs=("flex", "autodiff"), extras="[test]"),
    # MPI from the MPICH wheel: its tests run real `mpiexec -n 2` jobs on localhost; some train with ember-train
    Plugin("distributed", "plugins/extensions/ember-distributed", needs=("flex", "autodiff"), extras="[mpich]",
           libraries=(TRAIN,)),
]

_BY_NAME = {p.name: p for p in PLUGINS}

nox.options.sessions = ["lint", "core", *(f"core_{p.name}" for p in PLUGINS), "all", "docs"]


def _tests_dir(path: str) -> list[str]:
    tests = ROOT / path / "tests"
    return [str(tests.relative_to(ROOT))] if tests.is_dir() else []


def _editable(*paths: str) -> list[str]:
    args: list[str] = []
    for path in paths:
        args += ["-e", path]
    return args


def _workers(n: int) -> list[str]:
    return ["-n", str(n)] if n else []


def _conformance(session: nox.Session, device: str, workers: int = 0) -> None:
    session.run(
        "python", "-m", "pytest", "-p", "no:cacheprovider", *_workers(workers),
        "--pyargs", "ember.testing", f"--ember-device={device}", "-q",
        env=STRICT_ENV,
    )  # fmt: skip


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python=PYTHON)
def core(session: nox.Session) -> None:
    """ember-core's own tests, with the plugins they run on (flex and autodiff) and nothing else."""
    session.install(*_editable(f"{CORE}[test]", *(_BY_NAME[n].path for n in CORE_TEST_NEEDS)))
    session.run("python", "-m", "pytest", *_tests_dir(CORE), *session.posargs, env=STRICT_ENV)


def _make_plugin_session(plugin: Plugin) -> None:
    def run(session: nox.Session) -> None:
        needed = [path for n in plugin.needs for path in (*_BY_NAME[n].libraries, _BY_NAME[n].path)]
        session.install(*_editable(f"{CORE}[test]", *plugin.libraries, plugin.path + plugin.extras, *needed))
        session.run(
            "python", "-m", "pytest", *_workers(plugin.workers), *_tests_dir(plugin.path),
            *(t for lib in plugin.libraries if lib != TRAIN for t in _tests_dir(lib)), *session.posargs,
            env=STRICT_ENV,
        )  # fmt: skip
        for command in plugin.commands:
            session.run(*command, env=STRICT_ENV)
        if plugin.device:
            _conformance(session, plugin.device, plugin.workers)

    run.__doc__ = f"ember-core with {plugin.name} alone: the plugin's tests" + (
        f" and the conformance kit on {plugin.device}." if plugin.device else "."
    )
    nox.session(python=PYTHON, name=f"core_{plugin.name}")(run)


for _plugin in PLUGINS:
    _make_plugin_session(_plugin)


def _install_everything(session: nox.Session) -> None:
    # every first-party package from the checkout: pip must never look for an ember-* distribution on an index
    paths = [f"{CORE}[test]", KERNELS, CUPY, *(p.path + p.extras for p in PLUGINS), TRAIN, META]
    if (ROOT / EXAMPLE_BACKEND / "pyproject.toml").is_file():
        paths.append(EXAMPLE_BACKEND)
    session.install(*_editable(*paths))


@nox.session(python=PYTHON, name="all")
def all_packages(session: nox.Session) -> None:
    """Every package installed together: all test suites, tests/, and the conformance kit per backend."""
    _install_everything(session)
    # testpaths from pyproject.toml; the suites that want workers run on their own below
    parallel = [p for p in PLUGINS if p.workers and _tests_dir(p.path)]
    # --ignore of a directory does not apply to a testpaths entry naming it (pytest collects it anyway): a glob does
    ignores = [f"--ignore-glob=*{_tests_dir(p.path)[0]}/*" for p in parallel]
    session.run("python", "-m", "pytest", *_workers(2), *ignores, *session.posargs, env=STRICT_ENV)  # as test.sh
    for plugin in parallel:
        session.run("python", "-m", "pytest", *_workers(plugin.workers), *_tests_dir(plugin.path), env=STRICT_ENV)
    for plugin in PLUGINS:
        if plugin.device:
            _conformance(session, plugin.device, plugin.workers)


@nox.session(python=PYTHON)
def router_kit(session: nox.Session) -> None:
    """The conformance kit through the router decorator: flex+router(local) and flex+autodiff+router(local)."""
    session.install(*_editable(f"{CORE}[test]", *(_BY_NAME[n].path for n in ("flex", "autodiff", "router"))))
    for device in ("flex+router(local)", "flex+autodiff+router(local)"):
        _conformance(session, device, workers=2)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Docs examples (doctest over the Markdown pages) and the Sphinx build, warnings as errors, offline."""
    _install_everything(session)
    session.install(*DEV_DOCS)
    # Exit code 5 = no examples collected: fine while the pages have none.
    session.run(
        "python", "-m", "pytest", "-p", "no:cacheprovider", "--doctest-glob=*.md", "docs", "-q",
        env=STRICT_ENV, success_codes=[0, 5],
    )  # fmt: skip
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html", "-q")


@nox.session(python=PYTHON)
def bench_smoke(session: nox.Session) -> None:
    """Quick runs of the benchmarks (no timing assertions; they only have to run)."""
    _install_everything(session)
    for name in ("overhead.py", "autodiff.py", "suite.py"):
        session.run("python", str(Path("benchmarks") / name), "--quick")


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """The fuzz tests (tests/fuzz) at soak size: 70 cases per op and device, ~20,000 per device (EMBER_FUZZ_EXAMPLES
    overrides)."""
    _install_everything(session)
    # a few minutes per device on two CPU cores; `-- -k flex-add` narrows it
    examples = os.environ.get("EMBER_FUZZ_EXAMPLES", "70")
    session.run(
        "python", "-m", "pytest", "-p", "no:cacheprovider", "tests/fuzz", "-q", *session.posargs,
        env={**STRICT_ENV, "EMBER_FUZZ_EXAMPLES": examples},
    )  # fmt: skip


@nox.session(python=PYTHON)
def threads(session: nox.Session) -> None:
    """The thread-safety tests (tests/test_threads.py) in their long soak variant."""
    _install_everything(session)
    session.run(
        "python", "-m", "pytest", "-p", "no:cacheprovider", "tests/test_threads.py", "-q", *session.posargs,
        env={**STRICT_ENV, "EMBER_THREAD_SOAK": "1"},
    )  # fmt: skip
