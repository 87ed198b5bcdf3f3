"""What the synchronous benchmarks share: a daemon of their own on a temporary STASIS_HOME."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from stasis.paths import Paths, default_home

RESULTS = Path(__file__).parent / "results"


@contextmanager
def serving_daemon(prefix: str, serve_args: tuple[str, ...] = (), **extra_env: str) -> Iterator[Paths]:
    """Start `stasis serve` (with ``serve_args``: --tcp ...) on a fresh home (images shared with the user's cache
    unless ``extra_env`` names a STASIS_IMAGE_DIR); stop and clean up after."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    images = Path(extra_env.get("STASIS_IMAGE_DIR") or os.environ.get("STASIS_IMAGE_DIR") or default_home() / "images")
    paths = Paths(home=root / "home", images=images)
    paths.ensure()
    env = {**os.environ, **extra_env, "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(paths.images)}
    daemon = subprocess.Popen([sys.executable, "-m", "stasis", "serve", *serve_args], env=env,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(paths.socket))) as http:
            for _ in range(600):
                try:
                    http.get("http://stasis/v1/health")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
        yield paths
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        shutil.rmtree(paths.runtime, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def e2b_listening(client: Any, backend: str, memory_mb: int) -> Iterator[None]:
    """`stasis e2b serve` on a free port of loopback, its three variables exported for the E2B SDKs, while the
    block runs (the listener stays open while its stream is)."""
    from stasis.e2b_models import E2bServeRequest
    from stasis.sdk import e2b

    e2b.base_image(client)
    lines = e2b.serve(E2bServeRequest(listen="127.0.0.1:0", backend=backend, memory_mb=memory_mb), client)
    os.environ.update(next(lines)["exports"])
    try:
        yield
    finally:
        lines.close()


def timed(action: Callable[[], object], rounds: int) -> list[float]:
    """Seconds each of ``rounds`` calls of ``action`` took."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return samples


Comparison = tuple[list[float], list[float], str]  # stasis's samples, the baseline's, what the baseline is


def report_ratios(title: str, name: str, rows: dict[str, Comparison], report: dict[str, Any]) -> dict[str, Any]:
    """Print medians and ratios beside their baselines; write them (with ``report``) to results/NAME.json."""
    table = Table(title=f"{title}, medians", header_style="bold")
    for column in ("operation", "stasis", "baseline", "baseline is", "ratio"):
        table.add_column(column, justify="left" if column in ("operation", "baseline is") else "right")
    for operation, (ours, base, what) in rows.items():
        a, b = statistics.median(ours), statistics.median(base)
        table.add_row(operation, f"{a * 1000:.1f} ms", f"{b * 1000:.1f} ms", what, f"{a / b:.2f}x")
        report[operation] = {"stasis_s": a, "baseline_s": b, "baseline": what, "ratio": a / b}
    console = Console(width=120)
    console.print(table)
    write_results(name, report)
    console.print(f"wrote {RESULTS / f'{name}.json'}")
    return report


def write_results(name: str, report: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(report, indent=2))
    return path
