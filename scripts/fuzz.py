"""`make fuzz`: schemathesis against a real daemon (real sandboxes), bounded, 0 responses >= 500 allowed.

    .venv/bin/python scripts/fuzz.py [--max-examples 25] [--seed N]

The daemon runs on a temporary home with a TCP listener on loopback and a token, as a
user would serve it. A sandbox named ``fuzz`` exists throughout so that requests for a
sandbox reach a live one; every sandbox the fuzzer creates, forks or checkpoints is
removed at the end, and the run fails if anything leaked or any response was a 5xx.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from stasis import Client, Sandbox
from stasis.paths import Paths, default_home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_to_end(argv: list[str], env: dict[str, str]) -> int:
    """Run schemathesis; if we are stopped, it stops too (no requests after the clean-up)."""
    proc = subprocess.Popen(argv, env=env)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # so that the sandboxes are removed on the way out


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=25)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stasis-fuzz-"))
    images = Path(os.environ.get("STASIS_IMAGE_DIR") or default_home() / "images")
    paths = Paths(home=root / "home", images=images)
    paths.ensure()
    token, port = secrets.token_hex(16), free_port()
    env = {**os.environ, "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(images), "STASIS_TOKEN": token}
    checks = {**env, "SCHEMATHESIS_HOOKS": "fuzz_checks", "PYTHONPATH": str(Path(__file__).parent)}
    log = open(root / "daemon.log", "wb")  # noqa: SIM115 - the daemon writes to it until the end
    daemon = subprocess.Popen(
        [sys.executable, "-m", "stasis", "serve", "--tcp", f"127.0.0.1:{port}"], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(f"{url}/v1/health", headers={"authorization": f"Bearer {token}"}).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        client = Client(paths=paths)
        Sandbox.create("fuzz", memory_mb=256, client=client)
        config = root / "schemathesis.toml"  # requests for a sandbox name the live one, most of the time
        config.write_text('[parameters]\n"path.ref" = "fuzz"\n')
        argv = [
            str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config),
            "run", f"{url}/openapi.json",
            "-H", f"Authorization: Bearer {token}", "--checks", "not_a_server_error,echoes_no_long_input",
            "--request-timeout", "300", "--continue-on-failure", "--phases", "examples,fuzzing",
        ]  # fmt: skip
        if args.seed is not None:
            argv += ["--seed", str(args.seed)]
        # Every route; forks (up to 64 live copies each) get few examples of their own, or a 2-core host drowns.
        runs = [
            [*argv, "--max-examples", str(args.max_examples), "--exclude-path-regex", "/fork$"],
            [*argv, "--max-examples", "3", "--include-path-regex", "/fork$"],
        ]
        try:
            return max(run_to_end(run, checks) for run in runs)
        finally:
            for info in Sandbox.list(client=client):
                Sandbox(info, client).terminate()
            for checkpoint in Sandbox.list_checkpoints(client=client):
                Sandbox.delete_checkpoint(checkpoint.id, client=client)
            client.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=300)  # sandboxes it still runs are left running by design; it only stops
        log.close()
        errors = [
            line for line in (root / "daemon.log").read_text(errors="replace").splitlines() if "Traceback" in line
        ]
        if errors:
            print(f"the daemon logged {len(errors)} tracebacks; see {root / 'daemon.log'}", file=sys.stderr)
        else:
            shutil.rmtree(paths.runtime, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
