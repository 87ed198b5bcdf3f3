"""Checkpoints are durable artifacts: restore many times, fork live, refuse corrupt ones."""

from __future__ import annotations

import base64
import os
import sqlite3
import time

import pytest

from stasis import CheckpointCorrupt, CheckpointType, Client, Incompatible, Sandbox
from tests.conftest import Daemon, wait_until


def repl_say(sbx: Sandbox, proc_id: str, code: str, offset: int) -> tuple[str, int]:
    """Send a line to the REPL and wait for the line it prints."""
    sbx.write_stdin(proc_id, code + "\n")
    out = b""
    deadline = time.monotonic() + 20
    while not out.endswith(b"\n"):
        chunk = sbx.process_output(proc_id, offset=offset, wait=2)
        out += base64.b64decode(chunk.data_b64)
        offset = chunk.next_offset
        assert time.monotonic() < deadline, f"REPL did not answer {code!r}"
    return out.decode().strip(), offset


def test_memory_checkpoint_restores_a_repl_three_times_then_they_diverge(client: Client, backend: str) -> None:
    parent = Sandbox.create("repl-parent", memory_mb=512, backend=backend, client=client)
    repl = parent.start_process(["python3", "-u", "-i", "-q"], stdin=True, name="repl")
    answer, offset = repl_say(parent, repl.id, "state = {'n': 41, 'blob': bytes(range(256)) * 1000}; print('ready')", 0)
    assert answer == "ready"
    parent.write_file("/root/shared.txt", b"from the parent")

    ckpt = parent.checkpoint(CheckpointType.MEMORY, name="repl-state", metadata={"notes": ["n is 41"]})
    assert ckpt.type == CheckpointType.MEMORY and ckpt.sha256 and ckpt.size_bytes > 0
    assert ckpt.metadata == {"notes": ["n is 41"]}
    assert parent.run("echo still running").stdout == "still running\n"

    children = [Sandbox.create(f"repl-child-{i}", snapshot_id=ckpt.id, client=client) for i in range(3)]
    assert len({c.id for c in children}) == 3
    offsets = {}
    for i, child in enumerate(children):
        answer, offsets[child.id] = repl_say(
            child, repl.id, "state['n'] += 1; print(state['n'], len(state['blob']))", offset
        )
        assert answer == "42 256000", f"child {i} did not continue the REPL"
        child.write_file("/root/mine.txt", f"child {i}".encode())

    answer, offsets[children[0].id] = repl_say(
        children[0], repl.id, "state['n'] = 100; print(state['n'])", offsets[children[0].id]
    )
    assert answer == "100"
    for child in children[1:]:
        answer, offsets[child.id] = repl_say(child, repl.id, "print(state['n'])", offsets[child.id])
        assert answer == "42"
    answer, _ = repl_say(parent, repl.id, "print(state['n'])", offset)
    assert answer == "41"
    for i, child in enumerate(children):
        assert child.read_file("/root/mine.txt") == f"child {i}".encode()
        assert child.read_file("/root/shared.txt") == b"from the parent"
    assert parent.run("test -e /root/mine.txt").exit_code == 1

    parent.terminate()  # checkpoints outlive their sandbox
    again = Sandbox.create(snapshot_id="repl-state", client=client)
    answer, _ = repl_say(again, repl.id, "print(state['n'])", offset)
    assert answer == "41"
    for sbx in (*children, again):
        sbx.terminate()
    Sandbox.delete_checkpoint(ckpt.id, client=client)


def test_filesystem_checkpoint_restores_files_with_fresh_processes(client: Client, backend: str) -> None:
    sbx = Sandbox.create(memory_mb=256, backend=backend, client=client)
    sbx.write_file("/srv/app/config.toml", b"answer = 42\n")
    sbx.start_process(["sleep", "1000"], name="sleeper")
    ckpt = sbx.checkpoint("filesystem")
    restored = Sandbox.create(snapshot_id=ckpt.id, client=client)
    assert restored.read_file("/srv/app/config.toml") == b"answer = 42\n"
    assert restored.list_processes() == []
    assert "sleep 1000" not in restored.run("ps -eo args").stdout
    for s in (sbx, restored):
        s.terminate()
    Sandbox.delete_checkpoint(ckpt.id, client=client)


def test_copy_forks_running_sandboxes_that_diverge(client: Client, backend: str) -> None:
    parent = Sandbox.create("forker", memory_mb=256, backend=backend, client=client)
    count = "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.tmp; mv /tmp/n.tmp /tmp/n; sleep 0.05; done"
    counter = parent.start_process(["sh", "-c", count])
    wait_until(lambda: parent.run("test -s /tmp/n").exit_code == 0)
    forks = parent.copy(times=2)
    assert len(forks) == 2 and all(f.name.startswith("forker-") for f in forks)
    for fork in forks:
        assert fork.get_process(counter.id).status == "running"
        first = int(fork.read_file("/tmp/n"))
        wait_until(lambda fork=fork, first=first: int(fork.read_file("/tmp/n")) > first)
    forks[0].write_file("/tmp/only-here", b"1")
    assert forks[1].run("test -e /tmp/only-here").exit_code == 1
    assert parent.run("test -e /tmp/only-here").exit_code == 1
    kept = [c for c in Sandbox.list_checkpoints(client=client) if c.sandbox_id == parent.id]
    assert kept == []  # a fork's checkpoint is not kept (the shared daemon may hold other tests' templates)
    for s in (parent, *forks):
        s.terminate()


def test_a_checkpoint_whose_bytes_changed_is_refused(daemon: Daemon, client: Client, backend: str) -> None:
    sbx = Sandbox.create(memory_mb=256, backend=backend, client=client)
    sbx.write_file("/root/data", b"original")
    ckpt = sbx.checkpoint("memory")
    sbx.terminate()
    directory = daemon.paths.home / "checkpoints" / ckpt.id
    if backend == "gvisor":
        target, changed = directory / "files" / "root" / "data", "root/data"
        target.write_bytes(b"tampered")
    else:  # one flipped byte in the disk image
        target, changed = directory / "disk.qcow2", "disk.qcow2"
        with open(target, "r+b") as disk:
            disk.seek(100)
            byte = disk.read(1)
            disk.seek(100)
            disk.write(bytes([byte[0] ^ 0xFF]))
    before = set(daemon.paths.sandboxes.iterdir())
    with pytest.raises(CheckpointCorrupt, match=rf"corrupt.*{changed}"):
        Sandbox.create(snapshot_id=ckpt.id, client=client)
    assert set(daemon.paths.sandboxes.iterdir()) == before
    Sandbox.delete_checkpoint(ckpt.id, client=client)


def test_a_checkpoint_from_another_runtime_build_is_refused(daemon: Daemon, client: Client, backend: str) -> None:
    sbx = Sandbox.create(memory_mb=256, backend=backend, client=client)
    ckpt = sbx.checkpoint("memory")
    sbx.terminate()
    key = {"gvisor": "runsc_version", "microvm": "qemu_version"}[backend]
    with sqlite3.connect(daemon.paths.database) as db:
        (info,) = db.execute("SELECT info FROM checkpoints WHERE id = ?", (ckpt.id,)).fetchone()
        db.execute(
            "UPDATE checkpoints SET info = ? WHERE id = ?",
            (info.replace(f'"{ckpt.runtime[key]}"', '"0.0~19990101.0"'), ckpt.id),
        )
    with pytest.raises(Incompatible, match=r"0\.0~19990101\.0"):
        Sandbox.create(snapshot_id=ckpt.id, client=client)
    Sandbox.delete_checkpoint(ckpt.id, client=client)


def test_checkpoint_ttl_expires_visibly(client: Client) -> None:
    sbx = Sandbox.create(memory_mb=256, client=client)
    ckpt = sbx.checkpoint("filesystem", ttl_secs=1)
    assert ckpt.expires_at is not None and ckpt.expires_at <= time.time() + 1.5
    wait_until(lambda: ckpt.id not in {c.id for c in Sandbox.list_checkpoints(client=client)}, timeout=30)
    sbx.terminate()


CYCLES = 30  # `make soak` runs 1000 (benchmarks/cycles.py): here, enough that a leak per cycle shows


def open_descriptors(daemon: Daemon) -> int:
    assert daemon.proc is not None
    return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))


@pytest.mark.slow
def test_repeated_suspend_resume_cycles_keep_memory_and_files_and_leak_nothing(
    daemon: Daemon, client: Client, backend: str
) -> None:
    sbx = Sandbox.create("cycler", memory_mb=256, backend=backend, client=client)
    holder = sbx.start_process(["python3", "-u", "-i", "-q"], stdin=True)
    _, offset = repl_say(sbx, holder.id, "import hashlib, os; blob = os.urandom(8 << 20); print('ok')", 0)
    expected, offset = repl_say(sbx, holder.id, "print(hashlib.sha256(blob).hexdigest())", offset)
    sbx.suspend()
    sbx.resume()
    descriptors = open_descriptors(daemon)  # after a first cycle: what one cycle opens for good is open now
    for cycle in range(CYCLES):
        sbx.write_file(f"/root/cycles/{cycle}", str(cycle))
        sbx.suspend()
        sbx.resume()
        digest, offset = repl_say(sbx, holder.id, "print(hashlib.sha256(blob).hexdigest())", offset)
        assert digest == expected, f"memory changed at cycle {cycle}"
        names = sorted(int(e.name) for e in sbx.list_directory("/root/cycles"))
        assert names == list(range(cycle + 1)), f"files lost at cycle {cycle}"
    assert sbx.get_process(holder.id).pid == holder.pid
    # a descriptor kept per cycle would be CYCLES more; a few come and go with the daemon's own work
    assert open_descriptors(daemon) < descriptors + CYCLES // 2, "the daemon keeps descriptors across cycles"
    sbx.terminate()


def test_a_files_digest_ignores_holes_but_not_a_changed_byte(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A microVM's RAM file is mostly holes: its digest must cost what is written, and mean its content."""
    from stasis.daemon.core.checkpoints import _file_sha256

    sparse, dense, changed = tmp_path / "sparse", tmp_path / "dense", tmp_path / "changed"
    with open(sparse, "wb") as f:
        f.truncate(8 << 20)
        for offset, data in ((100, b"x" * 10), ((1 << 20) - 5, b"y" * 10), (5 << 20, b"z")):
            f.seek(offset)
            f.write(data)
    content = sparse.read_bytes()
    dense.write_bytes(content)
    changed.write_bytes(content[:-1] + b"\1")
    assert sparse.stat().st_blocks < dense.stat().st_blocks
    assert _file_sha256(sparse) == _file_sha256(dense)
    assert _file_sha256(changed) != _file_sha256(dense)


@pytest.mark.parametrize("backend", ["gvisor", "microvm"])
def test_a_filesystem_checkpoint_keeps_named_pipes(client: Client, backend: str) -> None:
    """gVisor keeps a FIFO the sandbox makes in its memory; a FILESYSTEM checkpoint still has it."""
    sbx = Sandbox.create("pipes", memory_mb=256, backend=backend, client=client)
    copy = None
    try:
        assert sbx.run("mkfifo -m 640 /root/pipe && mkdir -p /srv/q && mknod /srv/q/p p && chown 1:2 /srv/q/p "
                       "&& mkfifo /etc/in-image-dir.fifo").exit_code == 0  # fmt: skip
        checkpoint = sbx.checkpoint("filesystem")
        copy = Sandbox.create(snapshot_id=checkpoint.id, client=client)
        listed = copy.run("stat -c '%F %a %u:%g %n' /root/pipe /srv/q/p /etc/in-image-dir.fifo; stat -c '%a' /etc")
        assert listed.stdout.splitlines() == [
            "fifo 640 0:0 /root/pipe", "fifo 644 1:2 /srv/q/p", "fifo 644 0:0 /etc/in-image-dir.fifo", "755",
        ], listed.stdout + listed.stderr  # fmt: skip
        assert copy.run("cat /etc/hostname").exit_code == 0  # /etc is still the image's, merged
        Sandbox.delete_checkpoint(checkpoint.id, client=client)  # the session's daemon is shared: leave none
    finally:
        for box in (sbx, copy):
            if box is not None:
                box.terminate()
