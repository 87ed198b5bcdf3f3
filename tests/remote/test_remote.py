"""Sandboxes and checkpoints that move between nodes through a real S3-compatible server: a sandbox
suspended on node A resumes on node B with the same processes, memory and files; checkpoints restore
anywhere; a second checkpoint sends only what changed; a tampered piece is refused; of two nodes
racing to take a sandbox exactly one wins."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stasis import CheckpointCorrupt, Conflict, Sandbox, SandboxNotFound, StasisError
from stasis.paths import Paths
from tests.conftest import Daemon, wait_until
from tests.remote.conftest import BUCKET, S3

# A process that holds 16 MiB of random bytes in memory and reports, five times a second, how many
# rounds it has run and the hash of those bytes: memory lost or re-made shows as another hash, a
# process started again as a counter back at 1.
HOLDER = (
    "import hashlib, os, time\n"
    "data = bytearray(os.urandom(16 << 20))\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    open('/root/state.tmp', 'w').write(f'{i} {hashlib.sha256(data).hexdigest()}')\n"
    "    os.replace('/root/state.tmp', '/root/state')\n"
    "    time.sleep(0.2)\n"
)


def holder_state(sbx: Sandbox) -> tuple[int, str]:
    rounds, digest = sbx.read_file("/root/state").decode().split()
    return int(rounds), digest


def start_holder(sbx: Sandbox) -> int:
    sbx.write_file("/root/holder.py", HOLDER.encode())
    proc = sbx.start_process(["python3", "/root/holder.py"])
    wait_until(lambda: sbx.run("test -s /root/state").exit_code == 0, timeout=30)
    return proc.pid


def own_images(daemon: Daemon) -> Path:
    """A copy (hard links) of the shared image directory in the daemon's home, without the microVM base
    disks made from the images, or the templates (which name them), or the build steps' cache (the bulk of a
    shared directory, which other tests' builds fill, and of no use to a move)."""
    images = daemon.paths.home / "images"
    images.mkdir()
    for entry in daemon.paths.images.iterdir():
        if not entry.name.startswith(("build-", "e2b-", ".")):
            subprocess.run(["cp", "-al", str(entry), str(images / entry.name)], check=True)
    for made in (images / "microvm").glob("base*.ext4"):
        made.unlink()
    shutil.rmtree(images / "microvm" / "templates", ignore_errors=True)
    return images


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stasis", *args], env=daemon.env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("backend", ["gvisor", "microvm"])
def test_a_sandbox_suspended_on_one_node_resumes_on_another(nodes: tuple[Daemon, Daemon], backend: str) -> None:
    a, b = nodes
    if backend == "microvm":  # node B has the image and boot files but no base disk: it comes from the store
        b.paths = Paths(b.paths.home, own_images(b))
    a.start()
    b.start()
    with a.client() as client_a, b.client() as client_b:
        sbx = Sandbox.create("mover", backend=backend, memory_mb=512, client=client_a)
        sbx.write_file("/root/notes.txt", b"written on node A")
        pid = start_holder(sbx)
        rounds_before, digest = holder_state(sbx)

        pushed = cli(a, "push", "mover")
        assert pushed.returncode == 0, pushed.stderr
        assert "pushed sandbox mover" in pushed.stdout
        assert Sandbox.list(client=client_a) == []  # it left node A
        assert not (a.paths.sandboxes / sbx.id).exists()
        asked = cli(a, "run", "mover", "true")  # where it went, and how to have it back, not just "no sandbox"
        assert asked.returncode != 0 and "pushed to the remote store" in " ".join(asked.stderr.split())
        assert "stasis resume mover" in " ".join(asked.stderr.split())

        listed = json.loads(cli(b, "remote", "--json").stdout)
        assert [(e["name"], e["owner"], e["pushed_by"]) for e in listed] == [("mover", None, "node-a")]
        resumed = cli(b, "resume", "mover")  # node B finds it in the store, takes it over and resumes it
        assert resumed.returncode == 0, resumed.stderr
        moved = Sandbox.connect("mover", client=client_b)
        assert moved.id == sbx.id and moved.info().status.value == "running"
        assert moved.read_file("/root/notes.txt") == b"written on node A"
        assert moved.run(f"kill -0 {pid}").exit_code == 0, "the process is the same one"
        wait_until(lambda: holder_state(moved)[0] > rounds_before, timeout=30)
        rounds_after, digest_after = holder_state(moved)
        assert digest_after == digest, "its memory came along"
        assert rounds_after > rounds_before, "it went on counting, not from the start"
        if backend == "microvm":  # its disk's base is node B's copy, fetched from the store
            fetched = list((b.paths.images / "remote-externals").glob("ext4-*/file"))
            assert len(fetched) == 1
            info = subprocess.run(["qemu-img", "info", "-U", str(b.paths.sandboxes / sbx.id / "disk.qcow2")],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            assert f"backing file: {fetched[0]}" in info.stdout

        assert [e["owner"] for e in json.loads(cli(a, "remote", "--json").stdout)] == ["node-b"]
        with pytest.raises(Conflict, match="node-b"):  # node A refuses, and says where it went
            Sandbox.connect(sbx.id, client=client_a).resume()
        refused = cli(a, "resume", "mover")
        assert refused.returncode != 0 and "node-b" in refused.stderr


def test_checkpoints_restore_on_another_node_and_a_second_one_sends_only_what_changed(
    nodes: tuple[Daemon, Daemon], s3: S3
) -> None:
    a, b = (node.start() for node in nodes)
    with a.client() as client_a, b.client() as client_b:
        sbx = Sandbox.create("source", memory_mb=512, client=client_a)
        sbx.run("head -c 20000000 /dev/urandom > /root/big.bin && echo one > /root/version")
        pid = start_holder(sbx)
        _, digest = holder_state(sbx)
        memory = sbx.checkpoint("memory", name="warm")
        files = sbx.checkpoint("filesystem", name="files")
        first = Sandbox.push_checkpoint("warm", client=client_a)
        assert first.moved_chunks == first.chunks > 0
        assert Sandbox.push_checkpoint("files", client=client_a).moved_chunks < first.chunks  # big.bin was sent

        again = Sandbox.push_checkpoint("warm", client=client_a)  # pushed twice: nothing left to send
        assert again.moved_chunks == 0 and again.chunks == first.chunks

        restored = Sandbox.create("restored", snapshot_id="warm", client=client_b)  # fetched on first use
        assert restored.run(f"kill -0 {pid}").exit_code == 0
        assert holder_state(restored)[1] == digest
        assert restored.read_file("/root/version") == b"one\n"
        cold = Sandbox.create("cold", snapshot_id=files.id, client=client_b)
        assert cold.read_file("/root/version") == b"one\n"
        assert cold.run(f"kill -0 {pid}").exit_code != 0  # a FILESYSTEM checkpoint brings files, not processes
        assert {c.name for c in Sandbox.list_checkpoints(client=client_b)} == {"warm", "files"}
        assert Sandbox.get_checkpoint("warm", client=client_b).sha256 == memory.sha256
        df = cli(b, "df", "--json")
        assert '"remote_cache_chunks": 0' not in df.stdout and s3.env["STASIS_REMOTE"] in df.stdout


def test_second_checkpoint_of_a_sandbox_uploads_a_fraction_of_the_first(nodes: tuple[Daemon, Daemon]) -> None:
    a = nodes[0].start()
    with a.client() as client:
        sbx = Sandbox.create("growing", memory_mb=512, client=client)
        sbx.run("head -c 30000000 /dev/urandom > /root/data.bin")
        first = Sandbox.push_checkpoint(sbx.checkpoint("filesystem").id, client=client)
        sbx.run("echo small change > /root/change.txt")
        second = Sandbox.push_checkpoint(sbx.checkpoint("filesystem").id, client=client)
        print(f"first push {first.moved_bytes} bytes, second {second.moved_bytes} bytes")  # the report
        assert first.moved_bytes > 30_000_000 * 0.9
        assert second.moved_bytes < first.moved_bytes / 10


def test_a_tampered_piece_is_refused_and_nothing_is_restored(nodes: tuple[Daemon, Daemon], s3: S3) -> None:
    a, b = (node.start() for node in nodes)
    with a.client() as client_a, b.client() as client_b:
        sbx = Sandbox.create("victim", memory_mb=512, client=client_a)
        sbx.run("head -c 5000000 /dev/urandom > /root/data.bin")
        checkpoint = sbx.checkpoint("filesystem", name="victim-files")
        Sandbox.push_checkpoint("victim-files", client=client_a)
        chunk = max(s3.keys(s3.env["STASIS_REMOTE"].split("/", 3)[3] + "/chunks/"), key=len)
        body = s3.client().get_object(Bucket=BUCKET, Key=chunk)["Body"].read()
        s3.client().put_object(Bucket=BUCKET, Key=chunk, Body=body[:-8] + b"tampered")
        with pytest.raises(CheckpointCorrupt, match="does not match its sha256"):
            Sandbox.pull_checkpoint("victim-files", client=client_b)
        assert Sandbox.list_checkpoints(client=client_b) == []
        assert not (b.paths.home / "checkpoints" / checkpoint.id).exists()
        with pytest.raises(CheckpointCorrupt):
            Sandbox.create("from-tampered", snapshot_id="victim-files", client=client_b)
        assert Sandbox.list(client=client_b) == []
        # What the pull's message says to do repairs it: the push re-sends the damaged piece (only it).
        repaired = Sandbox.push_checkpoint("victim-files", client=client_a)
        assert 0 < repaired.moved_chunks <= 2
        Sandbox.pull_checkpoint("victim-files", client=client_b)
        copy = Sandbox.create("from-repaired", snapshot_id="victim-files", client=client_b)
        assert copy.run("sha256sum /root/data.bin").stdout == sbx.run("sha256sum /root/data.bin").stdout


def test_two_nodes_racing_to_take_a_sandbox_exactly_one_wins(nodes: tuple[Daemon, Daemon]) -> None:
    a, b = (node.start() for node in nodes)
    with a.client() as client_a, b.client() as client_b:
        sbx = Sandbox.create("contested", memory_mb=512, client=client_a)
        sbx.write_file("/root/mark", b"x")
        sbx.push()
        outcomes: dict[str, object] = {}

        def take(node: str, client) -> None:  # type: ignore[no-untyped-def]
            try:
                outcomes[node] = Sandbox.pull("contested", client=client)
            except StasisError as exc:
                outcomes[node] = exc

        racers = [threading.Thread(target=take, args=args) for args in (("a", client_a), ("b", client_b))]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        errors = [o for o in outcomes.values() if isinstance(o, StasisError)]
        won = [node for node, o in outcomes.items() if not isinstance(o, StasisError)]
        assert len(won) == 1 and len(errors) == 1, outcomes
        assert isinstance(errors[0], Conflict) and "node" in str(errors[0])
        winner, loser = (client_a, client_b) if won == ["a"] else (client_b, client_a)
        assert Sandbox.connect("contested", client=winner).resume().status.value == "running"
        assert Sandbox.connect("contested", client=winner).read_file("/root/mark") == b"x"
        again = Sandbox.pull("contested", client=winner)  # it is here already: nothing fetched, nothing lost
        assert again.moved_chunks == 0 and again.owner == ("node-a" if won == ["a"] else "node-b")
        assert Sandbox.connect("contested", client=winner).read_file("/root/mark") == b"x"
        with pytest.raises(SandboxNotFound):
            Sandbox.connect("contested", client=loser)


def test_without_a_remote_store_push_says_how_to_configure_one(own_daemon: Daemon) -> None:
    own_daemon.start()
    result = cli(own_daemon, "push", "anything")
    assert result.returncode != 0 and "STASIS_REMOTE=s3://" in result.stderr


def test_a_manifest_naming_a_path_instead_of_an_id_is_refused(nodes: tuple[Daemon, Daemon], s3: S3) -> None:
    a, b = (node.start() for node in nodes)
    with a.client() as client_a, b.client() as client_b:
        sbx = Sandbox.create("honest", memory_mb=512, client=client_a)
        checkpoint = sbx.checkpoint("filesystem", name="honest-files")
        pushed = Sandbox.push_checkpoint("honest-files", client=client_a)
        key = pushed.url.split("/", 3)[3]
        manifest = json.loads(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())
        manifest["record"]["id"] = "../../../../tmp/escaped"
        s3.client().put_object(Bucket=BUCKET, Key=key, Body=json.dumps(manifest).encode())
        with pytest.raises(CheckpointCorrupt, match="not an id stasis makes"):
            Sandbox.pull_checkpoint(checkpoint.id, client=client_b)
        assert not Path("/tmp/escaped").exists() and Sandbox.list_checkpoints(client=client_b) == []
