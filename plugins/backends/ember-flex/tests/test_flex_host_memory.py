"""The flex backend keeps freed host memory for reuse (glibc malloc's thresholds), and leaves malloc alone when told.

Each case runs in a fresh process: the setting is process-wide and made once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ember_flex import host_memory

pytestmark = pytest.mark.skipif(host_memory._glibc() is None, reason="malloc tuning is glibc's")

# Allocates and frees a 64 MiB array (above glibc's 32 MiB dynamic mmap ceiling) a few times after creating a flex
# device, and reports the minor page faults of the later rounds, when a cache would serve them from freed pages.
_PROBE = textwrap.dedent("""
    import json, resource
    import numpy as np
    import ember
    report = ember.Device.flex().memory_report()["allocator"]
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(16 << 20, np.float32); del a
    before = faults()
    for _ in range(4):
        a = np.ones(16 << 20, np.float32); del a
    print(json.dumps({"faults": faults() - before, "report": report}))
""")


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES",
                                                                                              "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_arrays_are_reused_without_faulting_pages_in_again() -> None:
    on = _probe()
    assert on["report"].endswith("host cache on)")
    assert on["faults"] < 64  # 4 rounds of 64 MiB: a page or two of bookkeeping, not the arrays' pages


def test_opt_out_leaves_malloc_unmapping_large_blocks() -> None:
    off = _probe(EMBER_FLEX_HOST_CACHE="0")
    assert "host cache off (EMBER_FLEX_HOST_CACHE=0)" in off["report"]
    # each round maps fresh memory: at least one fault per 2 MiB huge page, 16384 per round with 4 KiB pages
    assert off["faults"] >= 4 * 32


def test_users_own_malloc_tuning_wins() -> None:
    mine = _probe(MALLOC_TRIM_THRESHOLD_="1000000")
    assert "the user tunes malloc: MALLOC_TRIM_THRESHOLD_ set" in mine["report"]


def test_keep_freed_memory_is_idempotent_and_release_works() -> None:
    first = host_memory.keep_freed_memory()
    assert host_memory.keep_freed_memory() is first
    assert host_memory.describe().startswith("host cache ")
    assert isinstance(host_memory.release_free_memory(), bool)


def test_keep_freed_memory_from_several_threads_agrees() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: host_memory.keep_freed_memory(), range(32)))
    assert len(set(answers)) == 1 and answers[0] is host_memory.keep_freed_memory()
    assert host_memory.describe() in ("host cache on",) or host_memory.describe().startswith("host cache off (")
