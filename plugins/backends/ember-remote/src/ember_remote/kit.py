"""Run ember's conformance kit on ``remote``: ``python -m ember_remote.kit [--device flex] [pytest options]``.

Starts ``ember serve`` (``python -m ember_remote.server``) as a subprocess on 127.0.0.1 with a free port
(``--port 0``, read back from its ``listening`` log line), plaintext (``--insecure``: loopback only; the TLS path
has its own tests) and a random token in a fresh temporary directory; points the device string ``remote`` at it
(``EMBER_REMOTE_URL``, ``EMBER_REMOTE_TOKEN``, ``EMBER_REMOTE_INSECURE``); runs ``pytest --pyargs ember.testing
--ember-device=remote`` with the remaining options (``-n 2``: every xdist worker is its own session on the one
server); then stops the server with SIGTERM and removes the directory. The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: seconds to wait for the server's ``listening`` line (imports and plugin discovery on a loaded machine)
START_TIMEOUT = 120.0


def start_server(directory: Path, devices: list[str], extra: list[str] | None = None,
                 tls: tuple[Path, Path] | None = None) -> tuple[subprocess.Popen[bytes], int, str]:
    """Start ``ember serve`` for ``devices`` on 127.0.0.1 with a free port and a new token in ``directory``;
    returns ``(process, port, token)`` once it listens (its log goes to ``directory/serve.log``). ``tls``: the
    ``(cert, key)`` to serve with instead of plaintext; ``extra``: more options."""
    token = secrets.token_hex(32)
    (directory / "token").write_text(token + "\n")
    (directory / "token").chmod(0o600)
    log = directory / "serve.log"
    security = ["--insecure"] if tls is None else ["--cert", str(tls[0]), "--key", str(tls[1])]
    cmd = [sys.executable, "-m", "ember_remote.server", *security, "--host", "127.0.0.1", "--port", "0",
           "--token-file", str(directory / "token"), *[a for d in devices for a in ("--device", d)], *(extra or [])]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        for line in log.read_text(errors="replace").splitlines():
            if '"event": "listening"' in line:
                return proc, int(json.loads(line)["port"]), token
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(f"ember serve did not start ({' '.join(cmd)}):\n{log.read_text(errors='replace')}")
        time.sleep(0.1)


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM (graceful: batches in flight finish), then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Parse ``--device`` (the served device, default flex), pass everything else to pytest."""
    p = argparse.ArgumentParser(prog="python -m ember_remote.kit", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="flex", help="the device the server serves (default flex)")
    args, rest = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="ember-remote-kit-") as tmp:
        proc, port, token = start_server(Path(tmp), [args.device])
        try:
            env = {**os.environ, "EMBER_REMOTE_URL": f"ember://127.0.0.1:{port}/{args.device}",
                   "EMBER_REMOTE_TOKEN": token, "EMBER_REMOTE_INSECURE": "1"}
            env.pop("EMBER_REMOTE_FINGERPRINT", None)
            cmd = [sys.executable, "-m", "pytest", "--pyargs", "ember.testing", "--ember-device=remote", *rest]
            return subprocess.call(cmd, env=env)
        finally:
            stop_server(proc)


if __name__ == "__main__":
    sys.exit(main())
