"""Volumes through the remote store: a sandbox that moves to another node takes its volumes along, and a volume
pushes and pulls on its own (a copy: the newest push wins, a node never loses its own copy to a pull)."""

from __future__ import annotations

import json

import pytest

from stasis import NotFound, Sandbox, StasisError, Volume
from tests.conftest import Daemon
from tests.remote.conftest import S3
from tests.remote.test_remote import cli

FILES = (
    "mkdir -p /data/sub && echo from-a > /data/sub/note.txt && ln -s sub/note.txt /data/link"
    " && head -c 9M /dev/urandom > /data/blob && chmod 640 /data/blob"
)


def test_a_volume_follows_its_sandbox_to_another_node_and_moves_on_its_own(
    nodes: tuple[Daemon, Daemon], s3: S3
) -> None:
    a, b = nodes
    a.start()
    b.start()
    with a.client() as client_a, b.client() as client_b:
        Volume.create("project", max_size_mb=64, client=client_a)
        sbx = Sandbox.create("mover", backend="gvisor", volumes={"/data": "project"}, client=client_a)
        assert sbx.run(["sh", "-c", FILES]).exit_code == 0
        digest = sbx.run(["sha256sum", "/data/blob"]).stdout.split()[0]

        pushed = cli(a, "push", "mover")
        assert pushed.returncode == 0, pushed.stderr
        assert any(key.endswith("/volumes/project.json") for key in s3.keys(prefix=""))  # the volume went with it
        resumed = cli(b, "resume", "mover")  # node B lacks the volume: it is pulled before the sandbox is taken
        assert resumed.returncode == 0, resumed.stderr
        moved = Sandbox.connect("mover", client=client_b)
        assert moved.run(["cat", "/data/sub/note.txt"]).stdout == "from-a\n"
        assert moved.run(["readlink", "/data/link"]).stdout == "sub/note.txt\n"  # a link stays a link
        assert moved.run(["sha256sum", "/data/blob"]).stdout.split()[0] == digest
        assert moved.run(["stat", "-c", "%a", "/data/blob"]).stdout == "640\n"
        assert Volume.get("project", client=client_b).info().max_size_mb == 64  # its limit came too
        moved.run(["sh", "-c", "echo from-b > /data/sub/note.txt"])

        # Node A kept its copy (a volume is copied, never taken away): a pull does not overwrite it.
        with pytest.raises(StasisError, match="is on this node"):
            Volume.pull("project", client=client_a)
        pushed_alone = cli(b, "volume", "push", "project")  # the newest push wins
        assert pushed_alone.returncode == 0, pushed_alone.stderr
        Volume("project", client_a).delete()
        pulled = cli(a, "volume", "pull", "project")
        assert pulled.returncode == 0, pulled.stderr
        reader = Sandbox.create(backend="gvisor", volumes={"/data": "project"}, client=client_a)
        try:
            assert reader.run(["cat", "/data/sub/note.txt"]).stdout == "from-b\n"
        finally:
            reader.terminate()
        listed = json.loads(cli(a, "remote", "--json").stdout)
        assert ("volume", "project", "node-b") in {(e["kind"], e["name"], e["pushed_by"]) for e in listed}
        with pytest.raises(NotFound, match="no volume"):
            Volume.pull("never-pushed", client=client_a)
        with pytest.raises(StasisError, match="invalid volume name"):
            Volume.pull("../escape", client=client_a)
        moved.terminate()
        for client in (client_a, client_b):
            Volume("project", client).delete()

        # A node's own volume that only shares a name with the one a sandbox left with is never mounted by it.
        for client in (client_a, client_b):
            Volume.create("other", client=client)
        Sandbox.create("lonely", backend="gvisor", volumes={"/o": "other"}, client=client_a)
        assert cli(a, "push", "lonely").returncode == 0
        refused = cli(b, "resume", "lonely")
        assert refused.returncode != 0 and "is another volume" in " ".join(refused.stderr.split()), refused.stderr
        assert Sandbox.list(client=client_b) == []
        for client in (client_a, client_b):
            Volume("other", client).delete()
