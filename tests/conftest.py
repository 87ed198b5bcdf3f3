"""Fixtures: a real daemon on a real unix socket, over a temporary STASIS_HOME.

Images are shared with the user's cache (built by `make setup`) through
STASIS_IMAGE_DIR, so tests do not rebuild a 500 MB root filesystem.
The session ends by checking that nothing leaked: no runsc process, no mount
and no directory of the test homes survives.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from stasis import Client, Pool, Sandbox, mountns, procs
from stasis.backends import BACKENDS, register_backend
from stasis.network import namespaces
from stasis.paths import Paths, default_home
from tests.fakes import fake_agents
from tests.network.testhosts import leftover_namespaces

pytest_plugins = ["tests.profiling"]  # STASIS_TEST_PROFILE=DIR: where the time goes (scripts/test_profile.py)

procs.share_children()  # tests start CLIs and daemons with subprocess in a process where the reaper may run
REAL_BACKENDS = tuple(BACKENDS)  # before the fast tier's fake joins the registry
register_backend("fake", "tests.fakes:FakeBackend")

IMAGE_DIR = Path(os.environ.get("STASIS_IMAGE_DIR") or default_home() / "images")
TEST_ROOT = Path(tempfile.gettempdir()) / f"stasis-tests-{os.getpid()}"


class Daemon:
    """A `stasis serve` process we started, by pid, and can kill and restart."""

    def __init__(self, home: Path) -> None:
        self.paths = Paths(home=home, images=IMAGE_DIR)
        self.proc: subprocess.Popen | None = None
        # Kept for every (re)start. DNS of networked sandboxes: a test host's server or a dead local
        # port, never this machine's own resolver.
        self.sticky_env: dict[str, str] = {"STASIS_DNS_UPSTREAM": "127.0.0.1:9"}

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "STASIS_KILL_POINT"}
        paths = {"STASIS_HOME": str(self.paths.home), "STASIS_IMAGE_DIR": str(self.paths.images)}
        return {**env, **self.sticky_env, **paths}

    def start(self, *args: str, open_files: int | None = None, **extra_env: str) -> Daemon:
        """Start (or restart) the daemon; ``args`` (``--tcp``), ``open_files`` (its RLIMIT_NOFILE, soft and
        hard) and ``extra_env`` (e.g. STASIS_KILL_POINT) apply to this run only."""
        require_default_image()
        env = {**self.env, **extra_env}
        self.paths.home.mkdir(parents=True, exist_ok=True)
        log = open(self.paths.home / "daemon-test.log", "ab")  # noqa: SIM115 - the daemon keeps writing to it
        self.log_start = log.tell()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stasis", "serve", "--log-level", "DEBUG", *args],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=None if open_files is None else limit_open_files(open_files),
        )
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        transport = httpx.HTTPTransport(uds=str(self.paths.socket))
        with httpx.Client(transport=transport, base_url="http://stasis") as http:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"daemon exited with {self.proc.returncode}; see {self.paths.home}/daemon-test.log"
                    )
                try:
                    http.get("/v1/health", timeout=30).raise_for_status()
                    return
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self) -> Client:
        return Client(paths=self.paths)

    def log(self) -> str:
        return (self.paths.home / "daemon-test.log").read_text(errors="replace")

    def log_of_this_run(self) -> str:
        with open(self.paths.home / "daemon-test.log", "rb") as log:
            log.seek(self.log_start)
            return log.read().decode(errors="replace")

    def killed_at_its_kill_point(self) -> bool:
        """Whether this run ended by its STASIS_KILL_POINT. Its exit status alone cannot say: once a test
        in this process used stasis.procs, its reaper takes an exit nobody waited for within a moment
        (an orphan, as far as it can tell), and Popen then reads 0."""
        assert self.proc is not None
        return self.proc.returncode == -9 or "reached: SIGKILL" in self.log_of_this_run()


def limit_open_files(limit: int) -> Callable[[], None]:
    """For a child before exec: RLIMIT_NOFILE at ``limit``, soft and hard (it cannot raise it again)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def terminate_all(daemon: Daemon) -> None:
    with daemon.client() as client:
        for pool in Pool.list(client=client):  # its waiting members are in no list of sandboxes
            Pool.remove(pool.name, client=client)
        for info in Sandbox.list(client=client):
            Sandbox(info, client).terminate()


def sandbox_processes_under(home: Path) -> list[str]:
    """ "pid: command line" of runsc and QEMU processes whose state lives under ``home``."""
    found = procs.processes(lambda cmd: ("runsc" in cmd or "qemu-system" in cmd) and str(home) in cmd)
    return [f"{pid}: {cmdline}" for pid, cmdline in found]


def mounts_under(home: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(str(home))]


def mounts_in(pin: Path, directory: Path) -> list[str]:
    """Mounts under ``directory`` in the mount namespace pinned at ``pin`` (a daemon's, see stasis.mountns)."""
    seen = subprocess.run(["nsenter", f"--mount={pin}", "cat", "/proc/self/mounts"], capture_output=True, text=True)
    return [line.split()[1] for line in seen.stdout.splitlines() if line.split()[1].startswith(str(directory))]


def loop_devices_under(home: Path) -> list[str]:
    """Loop devices whose backing file (a gVisor sandbox's disk) lies under ``home``."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if (path := backing.read_text().strip()).startswith(str(home)):
                found.append(f"/dev/{backing.parent.parent.name}: {path}")
    return found


def require_default_image() -> None:
    if not any(IMAGE_DIR.glob("default-*/image.json")):
        pytest.exit(f"the default image is not built in {IMAGE_DIR}; run `make setup` first", returncode=2)


@pytest.fixture(scope="session", autouse=True)
def leak_check() -> Iterator[None]:
    TEST_ROOT.mkdir(parents=True, exist_ok=True)
    yield
    leaked_pins = []
    for home in TEST_ROOT.iterdir():  # a daemon killed on purpose cannot unpin its mount namespace
        pin = Paths(home, IMAGE_DIR).mount_pin
        if mountns.pinned(pin):
            inside = mounts_in(pin, home / "sandboxes")
            if [m for m in inside if m != str(home / "sandboxes")]:
                leaked_pins.append(f"{pin}: {inside}")
            subprocess.run(["umount", "--lazy", str(pin)], check=False)
            pin.unlink(missing_ok=True)
    leaked_processes = sandbox_processes_under(TEST_ROOT) + [f"{pid}: {cmd}" for pid, cmd in fake_agents(TEST_ROOT)]
    leaked_mounts = mounts_under(TEST_ROOT) + loop_devices_under(TEST_ROOT) + leaked_pins
    leftover = [str(p) for p in TEST_ROOT.glob("*/sandboxes/*")]
    leftover += [str(p) for home in TEST_ROOT.iterdir() for p in Paths(home, IMAGE_DIR).runsc_root.glob("*")]
    leftover += [str(p) for home in TEST_ROOT.iterdir() for p in (Paths(home, IMAGE_DIR).runtime / "vm").glob("*")]
    leaked_namespaces = [
        f"{home.name}: {sandbox_id}"
        for home in TEST_ROOT.iterdir()
        for sandbox_id in namespaces.sandbox_ids(Paths(home, IMAGE_DIR).runtime.name)
    ] + leftover_namespaces()
    for home in TEST_ROOT.iterdir():
        shutil.rmtree(Paths(home, IMAGE_DIR).runtime, ignore_errors=True)
    shutil.rmtree(TEST_ROOT, ignore_errors=True)
    assert not leaked_processes, f"runsc or QEMU processes leaked: {leaked_processes}"
    assert not leaked_mounts, f"mounts leaked: {leaked_mounts}"
    assert not leftover, f"sandbox directories leaked: {leftover}"
    assert not leaked_namespaces, f"network namespaces (with their devices and nftables) leaked: {leaked_namespaces}"
    assert not TEST_ROOT.exists(), f"{TEST_ROOT} could not be removed"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier (`-m "fast ..."`) imports only the modules that hold a fast test: the others would load
    Ray, Playwright, moto and E2B's SDKs in each worker for nothing."""
    name, markexpr = collection_path.name, config.getoption("markexpr", "") or ""
    if markexpr.startswith("fast") and name.startswith("test_") and name.endswith(".py"):
        return True if "mark.fast" not in collection_path.read_text() else None
    return None


def new_home(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=TEST_ROOT))


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """One daemon shared by the tests that do not kill it."""
    d = Daemon(new_home("shared")).start()
    yield d
    terminate_all(d)
    d.stop()


@pytest.fixture
def own_daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """A daemon of the test's own, on its own home: the test may kill and restart it."""
    d = Daemon(new_home(request.node.name[:40].replace("/", "_")))
    yield d
    if d.proc is not None and d.proc.poll() is not None:
        d.start()  # a killed daemon recovers first, so that everything can be removed cleanly
    if d.proc is not None:
        terminate_all(d)
        d.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


@pytest.fixture(params=REAL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Tests that take this run once per backend: gVisor and the QEMU microVM."""
    return str(request.param)


@pytest.fixture
def sandbox(client: Client, backend: str) -> Iterator[Sandbox]:
    sbx = Sandbox.create(client=client, memory_mb=512, backend=backend)
    yield sbx
    sbx.terminate()


@pytest.fixture
def own_sandbox(client: Client, backend: str) -> Iterator[Sandbox]:
    """A sandbox of the test's own, per backend, in a module whose ``sandbox`` is the shared one."""
    sbx = Sandbox.create(client=client, memory_mb=512, backend=backend)
    yield sbx
    sbx.terminate()


@pytest.fixture(scope="module", params=REAL_BACKENDS)
def shared_sandbox(request: pytest.FixtureRequest, daemon: Daemon) -> Iterator[Sandbox]:
    """One sandbox per backend for a whole module whose subject is not a sandbox's life (commands, files,
    streams): its tests leave it running, each with paths of its own. Such a module overrides ``sandbox``:
    ``@pytest.fixture`` ``def sandbox(shared_sandbox): return shared_sandbox``."""
    with daemon.client() as client:
        sbx = Sandbox.create(client=client, memory_mb=512, backend=str(request.param))
        yield sbx
        sbx.terminate()


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """``predicate`` true, eventually: ``timeout`` bounds a test that would otherwise hang, never a speed (at
    least 60 s: a loaded 2-core machine runs a TCG microVM 10x slower than a quiet one)."""
    timeout = max(timeout, 60.0)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
