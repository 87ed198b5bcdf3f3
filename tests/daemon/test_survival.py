"""The mission: processes, memory and files survive suspend → daemon SIGKILL → restart → resume."""

from __future__ import annotations

import json
import time

from stasis import Sandbox, SandboxStatus
from tests.conftest import Daemon, sandbox_processes_under, wait_until

HOLDER = r"""
import hashlib, json, os, signal, time
data = os.urandom(100 * 1024 * 1024)
def report(*_):
    with open("/root/holder.tmp", "w") as f:
        json.dump({"pid": os.getpid(), "sha": hashlib.sha256(data).hexdigest(), "at": time.time()}, f)
    os.rename("/root/holder.tmp", "/root/holder.json")
signal.signal(signal.SIGUSR1, report)
report()
while True:
    time.sleep(1)
"""
COUNTER = (
    "i=0; while :; do i=$((i+1)); echo $i > /root/counter.tmp; mv /root/counter.tmp /root/counter; sleep 0.1; done"
)


def holder_report(sbx: Sandbox, pid: int | None = None) -> dict:
    if pid is not None:
        sbx.run(f"rm -f /root/holder.json; kill -USR1 {pid}")
    wait_until(lambda: sbx.run("test -f /root/holder.json").exit_code == 0, timeout=30)
    return json.loads(sbx.read_file("/root/holder.json"))


def counter(sbx: Sandbox) -> int:
    return int(sbx.read_file("/root/counter"))


def test_processes_memory_and_files_survive_a_daemon_kill(own_daemon: Daemon, backend: str) -> None:
    own_daemon.start()
    client = own_daemon.client()
    sbx = Sandbox.create("survivor", memory_mb=1024, backend=backend, client=client)

    sbx.write_file("/root/holder.py", HOLDER)
    holder = sbx.start_process(["python3", "/root/holder.py"], name="holder")
    counting = sbx.start_process(COUNTER, name="counter")
    sbx.run("tmux new-session -d -s work -x 120 -y 30 && tmux send-keys -t work 'echo marker-$((6*7))' Enter")
    before = holder_report(sbx)
    assert before["pid"] == holder.pid
    wait_until(lambda: sbx.run("test -f /root/counter").exit_code == 0)
    wait_until(lambda: "marker-42" in sbx.run("tmux capture-pane -p -t work").stdout)
    tmux_pid = sbx.run("tmux display -p '#{pid}'").stdout.strip()
    sbx.write_file("/root/notes.txt", b"written before suspend")

    count_before = counter(sbx)
    sbx.suspend()
    assert sbx.status == SandboxStatus.SUSPENDED
    assert [p for p in sandbox_processes_under(own_daemon.paths.home) if sbx.id in p] == []

    own_daemon.kill()
    own_daemon.start()
    client.close()
    client = own_daemon.client()
    sbx = Sandbox.connect("survivor", client=client)
    assert sbx.status == SandboxStatus.SUSPENDED

    sbx.resume()
    count_after = counter(sbx)
    assert count_before <= count_after <= count_before + 20, "the counter must go on, not restart"
    wait_until(lambda: counter(sbx) > count_after)

    after = holder_report(sbx, holder.pid)
    assert after["pid"] == before["pid"] == holder.pid
    assert after["sha"] == before["sha"], "the 100 MB held in memory changed"
    assert after["at"] > before["at"]

    processes = {p.name: p for p in sbx.list_processes()}
    assert processes["holder"].pid == holder.pid and processes["holder"].status == "running"
    assert processes["counter"].pid == counting.pid and processes["counter"].status == "running"
    assert sbx.run("tmux display -p '#{pid}'").stdout.strip() == tmux_pid
    assert "marker-42" in sbx.run("tmux capture-pane -p -t work").stdout
    assert sbx.read_file("/root/notes.txt") == b"written before suspend"
    sbx.terminate()
    client.close()


def test_suspended_sandbox_has_no_process_on_the_host(daemon: Daemon, backend: str) -> None:
    with daemon.client() as client:
        sbx = Sandbox.create(client=client, memory_mb=256, backend=backend)
        assert [p for p in sandbox_processes_under(daemon.paths.home) if sbx.id in p]
        sbx.suspend()
        assert [p for p in sandbox_processes_under(daemon.paths.home) if sbx.id in p] == []
        with open("/proc/self/mounts") as mounts:
            assert sbx.id not in mounts.read()
        sbx.resume()
        assert sbx.run("echo back").stdout == "back\n"
        sbx.terminate()


def test_repeated_suspend_resume_keeps_state(daemon: Daemon, backend: str) -> None:
    with daemon.client() as client:
        sbx = Sandbox.create(client=client, memory_mb=256, backend=backend)
        code = "import os, time\nn = 0\nwhile True:\n    n += 1\n    open('/root/n.tmp', 'w').write(str(n))\n"
        code += "    os.rename('/root/n.tmp', '/root/n')\n    time.sleep(0.05)\n"
        proc = sbx.start_process(["python3", "-c", code])  # renamed into place: never read half-written
        wait_until(lambda: sbx.run("test -s /root/n").exit_code == 0)
        last = 0
        for cycle in range(5):
            sbx.write_file(f"/root/cycle-{cycle}", str(cycle))
            sbx.suspend()
            sbx.resume()
            now = int(sbx.read_file("/root/n"))
            assert now >= last
            last = now
            assert sbx.get_process(proc.id).status == "running"
            assert sorted(e.name for e in sbx.list_directory("/root") if e.name.startswith("cycle-")) == [
                f"cycle-{i}" for i in range(cycle + 1)
            ]
        time.sleep(0.2)
        assert int(sbx.read_file("/root/n")) > last
        sbx.terminate()


def test_a_suspend_without_memory_keeps_the_files_and_boots_them_again_after_a_daemon_kill(
    own_daemon: Daemon, backend: str
) -> None:
    own_daemon.start()
    client = own_daemon.client()
    sbx = Sandbox.create(memory_mb=256, backend=backend, client=client)
    sbx.write_file("/root/kept.txt", "written through the API")
    sbx.run("echo written-by-a-shell > /root/shell.txt")  # in a page cache until the suspend flushes it
    sbx.start_process(["sleep", "600"], name="sleeper")
    suspended = sbx.suspend(keep_memory=False)
    assert suspended.status == SandboxStatus.SUSPENDED
    assert [p for p in sandbox_processes_under(own_daemon.paths.home) if sbx.id in p] == []

    own_daemon.kill()  # recovery keeps it suspended: its files are all it has to keep
    own_daemon.start()
    client.close()
    client = own_daemon.client()
    sbx = Sandbox.connect(sbx.id, client=client)
    assert sbx.status == SandboxStatus.SUSPENDED

    sbx.resume()  # a cold boot with its files
    assert sbx.read_file("/root/kept.txt") == b"written through the API"
    assert sbx.read_file("/root/shell.txt") == b"written-by-a-shell\n"
    assert sbx.run("pgrep -x sleep").exit_code == 1  # its processes were not kept
    assert "sleeper" not in {p.name for p in sbx.list_processes()}
    sbx.suspend()  # and a suspend after it keeps memory again, as the sandbox was made
    sbx.resume()
    assert sbx.read_file("/root/kept.txt") == b"written through the API"
    sbx.terminate()
    client.close()
