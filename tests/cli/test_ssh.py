"""`ssh stasis-NAME` with the real OpenSSH client and server, through stasis: no network in the sandbox."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stasis import Client, Sandbox, SandboxStatus
from stasis import ssh as ssh_module
from tests.conftest import Daemon, wait_until

S = SandboxStatus
STASIS = Path(sys.executable).parent / "stasis"


@dataclass
class SshClient:
    """A user of this host: their own $HOME with a key pair, and the config `stasis ssh-config` prints."""

    env: dict[str, str]
    config: Path
    home: Path

    def argv(self, *args: str, key: Path | None = None) -> list[str]:
        """ssh finds keys under the passwd entry's home, not $HOME: name this user's key."""
        identity = key or self.home / ".ssh" / "id_ed25519"
        return ["-F", str(self.config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=60", "-o", "IdentitiesOnly=yes",
                "-i", str(identity), *args]  # fmt: skip

    def ssh(
        self, host: str, *command: str, key: Path | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", *self.argv(host, *command, key=key)]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)

    def popen(self, host: str, *command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["ssh", *self.argv(host, *command)], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)


def keypair(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def ssh_client(daemon: Daemon, tmp_path: Path) -> SshClient:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    keypair(home / ".ssh" / "id_ed25519")
    env = {**daemon.env, "HOME": str(home), "PATH": f"{STASIS.parent}:{os.environ['PATH']}"}
    printed = subprocess.run([str(STASIS), "ssh-config"], env=env, capture_output=True, text=True, check=True)
    assert "Host stasis-*" in printed.stdout and "ProxyCommand" in printed.stdout
    config = tmp_path / "ssh_config"
    config.write_text(printed.stdout)
    return SshClient(env, config, home)


@pytest.fixture
def user(daemon: Daemon, tmp_path: Path) -> SshClient:
    return ssh_client(daemon, tmp_path)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_ssh_scp_and_rsync_reach_a_sandbox_that_has_no_network(client: Client, backend: str, user: SshClient,
                                                                tmp_path: Path) -> None:  # fmt: skip
    sbx = Sandbox.create(f"ssh-{backend}", memory_mb=512, backend=backend, client=client)
    host = f"stasis-ssh-{backend}"
    try:
        hello = user.ssh(host, "echo hi from $(hostname); awk -F: 'NR > 2 {print $1}' /proc/net/dev")
        assert hello.returncode == 0, hello.stderr
        assert hello.stdout.splitlines()[0] == f"hi from ssh-{backend}"
        assert set(hello.stdout.split()[3:]) <= {"lo"}, "the sandbox has a network device"

        blob = tmp_path / "blob.bin"
        blob.write_bytes(os.urandom(20 << 20))
        up = user.run("scp", *user.argv(str(blob), f"{host}:/root/blob.bin"))
        assert up.returncode == 0, up.stderr
        assert sbx.run("sha256sum /root/blob.bin").stdout.split()[0] == sha256(blob)
        down = user.run("scp", *user.argv(f"{host}:/root/blob.bin", str(tmp_path / "back.bin")))
        assert down.returncode == 0, down.stderr
        assert sha256(tmp_path / "back.bin") == sha256(blob)

        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "a.txt").write_text("alpha")
        (tree / "sub" / "b.txt").write_text("beta")
        rsh = f"ssh {' '.join(user.argv())}"
        synced = user.run("rsync", "-a", "-e", rsh, f"{tree}/", f"{host}:/root/tree/")
        assert synced.returncode == 0, synced.stderr
        assert sbx.read_file("/root/tree/sub/b.txt") == b"beta"

        stranger = keypair(tmp_path / "stranger")  # not in ~/.ssh: never authorised
        refused = user.ssh(host, "true", key=stranger)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr
    finally:
        sbx.terminate()


def test_after_suspend_a_new_ssh_finds_its_tmux_session_and_forks_have_their_own_host_keys(
    client: Client, backend: str, user: SshClient
) -> None:
    sbx = Sandbox.create(f"tmux-{backend}", memory_mb=512, backend=backend, client=client)
    made: list[Sandbox] = []
    try:
        started = user.ssh(f"stasis-tmux-{backend}", "tmux new-session -d -s keep 'echo marker-41; exec sleep 1000'")
        assert started.returncode == 0, started.stderr
        sbx.suspend()
        assert sbx.info().status == S.SUSPENDED
        screen = user.ssh(f"stasis-tmux-{backend}", "tmux capture-pane -p -t keep")  # resumes it
        assert screen.returncode == 0 and "marker-41" in screen.stdout, screen.stderr

        made = sbx.copy(times=1)
        fork = made[0]
        assert fork.ssh_host_key() != sbx.ssh_host_key()
        there = user.ssh(f"stasis-{fork.info().name or fork.id}", "tmux capture-pane -p -t keep")
        assert there.returncode == 0 and "marker-41" in there.stdout, there.stderr  # checked against its own key
    finally:
        for box in [sbx, *made]:
            box.terminate()


@pytest.mark.parametrize("backend", ["gvisor"])  # the daemon counts the session as activity: the same for both
def test_an_open_ssh_session_holds_the_sandbox_awake(client: Client, backend: str, user: SshClient) -> None:
    sbx = Sandbox.create("sshidle", timeout_secs=2, memory_mb=256, backend=backend, client=client)
    try:
        session = user.popen("stasis-sshidle", "sleep 8; echo slept")
        time.sleep(6)
        assert sbx.info().status == S.RUNNING  # 3 idle timeouts passed under the session
        out, err = session.communicate(timeout=60)
        assert session.returncode == 0 and out == "slept\n", err
        try:
            wait_until(lambda: sbx.info().status == S.SUSPENDED, timeout=60)
        except AssertionError:  # seen once under load (cause not found): say what still held it
            info, running = sbx.info(), [(p.id, p.cmd) for p in sbx.list_processes() if p.status == "running"]
            raise AssertionError(
                f"not suspended after the session: {info.status}, idle since "
                f"{time.time() - info.last_activity:.0f}s, running {running}"
            ) from None
    finally:
        sbx.terminate()


@pytest.fixture
def own_user(own_daemon: Daemon, tmp_path: Path) -> Iterator[SshClient]:
    own_daemon.start()
    yield ssh_client(own_daemon, tmp_path)


def test_a_daemon_killed_during_a_session_drops_it_and_the_next_one_works(
    own_daemon: Daemon, own_user: SshClient
) -> None:
    sbx = Sandbox.create("sshcrash", memory_mb=256, client=own_daemon.client())
    sbx.write_file("/root/kept", "intact")
    session = own_user.popen("stasis-sshcrash", "echo started; sleep 300")
    try:
        assert session.stdout is not None and session.stdout.readline() == "started\n"
        own_daemon.kill()
        session.wait(timeout=30)
        assert session.returncode != 0  # the connection dropped
    finally:
        if session.poll() is None:
            session.kill()
    own_daemon.start()
    again = own_user.ssh("stasis-sshcrash", "cat /root/kept")
    assert again.returncode == 0 and again.stdout == "intact", again.stderr
    assert sbx.info().status == S.RUNNING

    def sessions() -> list[str]:
        return [p.id for p in sbx.list_processes() if p.id.startswith("ssh-") and p.status == "running"]

    try:
        wait_until(lambda: sessions() == [], timeout=20)  # the dropped session was hung up, as sshd would be
    except AssertionError as exc:
        log = own_daemon.log()[-6000:]
        raise AssertionError(f"{exc}; {sessions()} still run. The daemon's log ends:\n{log}") from None


def test_stasis_ssh_without_any_key_says_how_to_make_or_give_one(daemon: Daemon, tmp_path: Path) -> None:
    keyless = ssh_client(daemon, tmp_path)
    for own in (keyless.home / ".ssh").glob("id_*"):
        own.unlink()
    sbx = Sandbox.create("sshnokey", memory_mb=256, client=daemon.client())
    try:
        result = keyless.run(str(STASIS), "ssh", "sshnokey", "--", "true")
        said = " ".join(result.stderr.split())
        assert result.returncode != 0 and "ssh-keygen -t ed25519" in said and "--key" in said, result.stderr
    finally:
        sbx.terminate()


def test_stasis_ssh_runs_a_command_with_a_given_key_which_stays_authorised(
    client: Client, user: SshClient, tmp_path: Path
) -> None:
    sbx = Sandbox.create("sshcli", memory_mb=256, client=client)
    try:
        extra = keypair(tmp_path / "deploy")  # not in ~/.ssh: only --key authorises it
        first = user.run(str(STASIS), "ssh", "sshcli", "--key", f"{extra}.pub", "--", "echo", "via-stasis-ssh")
        assert first.returncode == 0 and first.stdout == "via-stasis-ssh\n", first.stderr
        later = user.ssh("stasis-sshcli", "true", key=extra)  # plain ssh, the same key, later
        assert later.returncode == 0, later.stderr
        for own in (user.home / ".ssh").glob("id_ed25519*"):  # the user's default key gone: only --key's is left
            own.rename(own.with_name(f"moved-{own.name}"))
        again = user.run(str(STASIS), "ssh", "sshcli", "--", "echo", "remembered")  # no --key: it is used again
        assert again.returncode == 0 and again.stdout == "remembered\n", again.stderr

        config = user.home / ".ssh" / "config"
        config.write_text("Host *\n    UserKnownHostsFile /dev/null\n")  # a user's defaults: they must not win
        for _ in range(2):  # idempotent
            installed = user.run(str(STASIS), "ssh-config", "--install")
            assert installed.returncode == 0, installed.stderr
        assert config.read_text().count("Host stasis-*") == 1 and config.read_text().startswith(ssh_module.BEGIN)
        plain = user.run("ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                         "-i", str(extra), "stasis-sshcli", "echo", "installed")  # fmt: skip
        assert plain.returncode == 0 and plain.stdout == "installed\n", plain.stderr
    finally:
        sbx.terminate()


def test_an_image_without_an_ssh_server_is_told_what_to_install(client: Client, user: SshClient) -> None:
    sbx = Sandbox.create("nosshd", memory_mb=256, client=client)
    try:
        sbx.run("mv /usr/sbin/sshd /usr/sbin/sshd.gone")
        refused = user.ssh("stasis-nosshd", "true")
        assert refused.returncode == 255 and "openssh-server" in refused.stderr, refused.stderr
    finally:
        sbx.terminate()


def test_a_sandbox_cannot_make_ssh_distrust_another_one(client: Client, user: SshClient) -> None:
    """Host keys are the daemon's record: what a sandbox writes in its files never reaches known_hosts."""
    a = Sandbox.create("ssh-attacker", memory_mb=256, client=client)
    b = Sandbox.create("ssh-victim", memory_mb=256, client=client)
    try:
        assert user.ssh("stasis-ssh-victim", "true").returncode == 0
        victim_key = b.ssh_host_key()
        planted = f"@revoked * {victim_key}\n@cert-authority * {victim_key}\n"
        for folder in (f"/etc/stasis/ssh/{a.id}", "/run/stasis-ssh"):  # where keys were kept, and are written now
            a.write_file(f"{folder}/ssh_host_ed25519_key.pub", f"{a.ssh_host_key()}\n{planted}".encode())
        known_hosts = Path(user.env["STASIS_HOME"]) / "ssh" / "known_hosts"  # ssh_module.known_hosts_file's
        with known_hosts.open("a") as f:  # as an older stasis let a sandbox inject it
            f.write(planted)
        assert "\n" not in a.ssh_host_key() and "@" not in a.ssh_host_key()
        into_a = user.ssh("stasis-ssh-attacker", "echo in-a")
        assert into_a.returncode == 0 and into_a.stdout.strip() == "in-a", into_a.stderr
        into_b = user.ssh("stasis-ssh-victim", "echo in-b")
        assert into_b.returncode == 0 and into_b.stdout.strip() == "in-b", into_b.stderr
        assert "@" not in known_hosts.read_text()
        a.run("head -c 100 /dev/urandom > /run/stasis-ssh/ssh_host_ed25519_key")  # the next session writes it anew
        assert user.ssh("stasis-ssh-attacker", "true").returncode == 0
    finally:
        a.terminate()
        b.terminate()
