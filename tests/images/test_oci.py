"""Bring your own image: OCI and Docker images imported without a Docker daemon, run on both backends.

The images are made here, offline (tests/images/ociimages.py): a small root filesystem with python3
and busybox, an image config with Env, WorkingDir and User."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stasis import CheckpointType, Conflict, Sandbox
from stasis.images import ImageStore
from stasis.images.layers import link_tree
from stasis.paths import Paths
from stasis.sdk._base import Call
from tests.conftest import Daemon, new_home, terminate_all
from tests.images.conftest import stasis
from tests.images.ociimages import default_image, oci_layout


def store_of(daemon: Daemon) -> ImageStore:
    return ImageStore(daemon.paths.images)


def test_an_imported_image_runs_with_its_env_workdir_and_user(images_daemon: Daemon, imported: str,
                                                               backend: str) -> None:  # fmt: skip
    with images_daemon.client() as client:
        sbx = Sandbox.create(client=client, image=imported, backend=backend, memory_mb=256)
        try:
            assert sbx.run("pwd").stdout == "/srv/app\n"  # WorkingDir
            assert sbx.run("id -u").stdout == "1000\n"  # User
            assert sbx.run("echo $GREETING; echo $HOME").stdout == "hello from the image\n/home/app\n"  # Env
            assert sbx.run("cat hello.txt").stdout == "from the image\n"
            assert sbx.run("id -u", user="root").stdout == "0\n"  # a request overrides the image
            assert sbx.run("pwd", working_dir="/").stdout == "/\n"
            proc = sbx.start_process(["sh", "-c", "id -u > /home/app/who; sleep 60"])
            deadline = time.monotonic() + 20
            while sbx.run("test -s /home/app/who").exit_code != 0:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert sbx.read_file("/home/app/who") == b"1000\n"
            sbx.kill_process(proc.id)
            sbx.suspend()
            assert sbx.run("echo $GREETING").stdout == "hello from the image\n"  # resumed, same image config
        finally:
            sbx.terminate()
    info = json.loads(stasis(images_daemon, "image", "inspect", imported).stdout)
    assert info["config"]["user"] == "app" and info["config"]["working_dir"] == "/srv/app"
    assert info["config"]["manifest_digest"].startswith("sha256:") and info["key"].startswith("pyapp-")


def test_every_transport_imports_and_the_same_content_is_one_image(images_daemon: Daemon,
                                                                   made: dict[str, str]) -> None:  # fmt: skip
    store = store_of(images_daemon)
    first = store.import_image(made["oci"], "layout-app")
    blobs = sorted((images_daemon.paths.images / "oci/layout/blobs/sha256").iterdir())
    again = store.import_image(made["oci-archive"], "layout-app")  # the same manifest: the same image
    assert again.key == first.key
    assert sorted((images_daemon.paths.images / "oci/layout/blobs/sha256").iterdir()) == blobs  # stored once
    assert [i.key for i in store.list() if i.name == "layout-app"] == [first.key]
    assert store.get("layout-app").config.source == made["oci"]


def assert_nothing_half_made(daemon: Daemon, before: list[str]) -> None:
    images = daemon.paths.images
    assert [i.key for i in store_of(daemon).list()] == before
    assert not [p.name for p in images.iterdir() if p.name.startswith(".")], "a staging directory was left"
    index = json.loads((images / "oci/layout/index.json").read_text()) if (images / "oci/layout").exists() else {}
    tags = [m.get("annotations", {}).get("org.opencontainers.image.ref.name", "") for m in index.get("manifests", [])]
    assert not [t for t in tags if t.startswith("importing-")], tags


def test_bad_images_are_refused_clearly(images_daemon: Daemon, made: dict[str, str], tmp_path: Path) -> None:
    """Through the CLI, as a user imports (a process of its own)."""
    before = [i.key for i in store_of(images_daemon).list()]
    cases = {
        made["corrupt"]: "failed",
        made["arm64"]: "linux/arm64; this host runs linux/amd64",
        f"oci-archive:{tmp_path / 'missing.tar'}": "does not exist",
        "registry.test/app:1": "name its transport",
        made["oci"]: "built-in recipe",
    }
    for ref, message in cases.items():
        result = stasis(images_daemon, "image", "import", ref, "--name", "default" if ref == made["oci"] else "bad")
        assert result.returncode == 1 and message in " ".join(result.stderr.split()), (ref, result.stderr)
        assert_nothing_half_made(images_daemon, before)


def test_an_import_killed_midway_leaves_nothing(images_daemon: Daemon, made: dict[str, str]) -> None:
    """The daemon imports (the only writer of images): killed while it unpacks, it leaves nothing half-made,
    and the next import clears what was left."""
    before = [i.key for i in store_of(images_daemon).list()]
    proc = subprocess.Popen([sys.executable, "-m", "stasis", "image", "import", made["v2"], "--name", "killed"],
                            env={**os.environ, **images_daemon.env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    images = images_daemon.paths.images
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(".import-") for p in images.iterdir()):  # unpacking: the longest step
        assert proc.poll() is None and time.monotonic() < deadline, "the import ended before it could be killed"
        time.sleep(0.005)
    images_daemon.kill()
    proc.wait()
    assert proc.returncode != 0  # the client is told the import did not finish
    images_daemon.start()
    assert [i.key for i in store_of(images_daemon).list()] == before  # nothing half-made is visible
    result = stasis(images_daemon, "image", "import", made["v2"], "--name", "killed")  # clears what was left
    assert result.returncode == 0, result.stderr
    assert_nothing_half_made(images_daemon, sorted([*before, store_of(images_daemon).get("killed").key]))


def test_rm_refuses_an_image_in_use_and_prune_removes_superseded_builds(images_daemon: Daemon,
                                                                         made: dict[str, str]) -> None:  # fmt: skip
    store = store_of(images_daemon)
    old = store.import_image(made["oci"], "churn")
    with images_daemon.client() as client:
        sbx = Sandbox.create(client=client, image="churn", memory_mb=256)
        checkpoint = sbx.checkpoint(CheckpointType.FILESYSTEM)
        with pytest.raises(Conflict, match=f"sandbox {sbx.id}.*checkpoint {checkpoint.id}"):
            client.call(Call("DELETE", "/v1/images/churn"))
        sbx.terminate()
        with pytest.raises(Conflict, match=f"checkpoint {checkpoint.id}"):
            client.call(Call("DELETE", "/v1/images/churn"))
        Sandbox.delete_checkpoint(checkpoint.id, client=client)
        time.sleep(0.01)
        new = store.import_image(made["v2"], "churn")  # a new import under the same name supersedes the old
        assert store.get("churn").key == new.key
        result = stasis(images_daemon, "image", "prune")
        assert result.returncode == 0 and old.key in result.stdout
        assert [i.key for i in store.list() if i.name == "churn"] == [new.key]
        result = stasis(images_daemon, "image", "rm", "churn")
        assert result.returncode == 0, result.stderr
        assert not [i for i in store.list() if i.name == "churn"]


def test_an_image_without_python_runs_on_stasiss_own(images_daemon: Daemon, made: dict[str, str],
                                                     backend: str) -> None:  # fmt: skip
    """busybox and nothing else: the agent runs on the interpreter stasis brings, the image untouched."""
    store = store_of(images_daemon)
    info = store.import_image(made["no-python"], "bare")
    assert info.python == ""
    rootfs = Path(info.path) / "rootfs"
    assert not (rootfs / "usr/bin/python3").exists() and not any((rootfs / "opt/stasis-python").iterdir())
    with images_daemon.client() as client:
        sbx = Sandbox.create(client=client, image="bare", backend=backend, memory_mb=256)
        try:
            assert sbx.run("echo $GREETING; id -u").stdout == "hello from the image\n0\n"
            assert sbx.run("command -v python3 || echo none").stdout == "none\n"  # the image's PATH has none
            sbx.write_file("/root/note.txt", b"files work\n")
            assert sbx.run(["cat", "/root/note.txt"]).stdout == "files work\n"
            assert sbx.run("touch /opt/stasis-python/x").exit_code != 0  # stasis's python is read-only
            server = sbx.start_process(["sleep", "300"])
            sbx.suspend()
            assert sbx.get_process(server.id).status == "running"  # resumed: the same process
        finally:
            sbx.terminate()
    assert not any((rootfs / "opt/stasis-python").iterdir())  # nothing was written into the image


def hostile_layouts(work: Path, victim: Path) -> dict[str, str]:
    """Images as an attacker would make them: /opt or /etc a link to a host directory; a small layer that
    unpacks to far more than it weighs (zeros compress a thousandfold)."""
    refs = {}
    for name in ("opt", "etc"):
        rootfs = work / f"linked-{name}"
        (rootfs / "bin").mkdir(parents=True)
        if name == "opt":
            (rootfs / "etc").mkdir()
        (rootfs / name).symlink_to(victim)
        refs[name] = oci_layout(rootfs, work / f"layout-{name}", "v1", env={})
    bomb = work / "bomb"
    (bomb / "etc").mkdir(parents=True)
    with open(bomb / "zeros", "wb") as f:
        for _ in range(192):
            f.write(bytes(1 << 20))
    refs["bomb"] = oci_layout(bomb, work / "layout-bomb", "v1", env={})
    return refs


def test_an_image_never_writes_to_the_host_and_a_bomb_is_stopped(images_daemon: Daemon, tmp_path: Path) -> None:
    victim = tmp_path / "host-dir"
    victim.mkdir()
    refs = hostile_layouts(tmp_path / "work", victim)
    before = [i.key for i in store_of(images_daemon).list()]
    for name in ("opt", "etc"):
        result = stasis(images_daemon, "image", "import", refs[name], "--name", f"linked-{name}")
        assert result.returncode == 1 and f"the directory /{name}" in " ".join(result.stderr.split()), result.stderr
        assert list(victim.iterdir()) == [], f"an import through /{name} wrote to the host"
        assert_nothing_half_made(images_daemon, before)
    images_daemon.stop()
    images_daemon.start(STASIS_IMAGE_MAX_MB="64")  # the daemon imports: its limit applies (this run only)
    try:
        bomb = stasis(images_daemon, "image", "import", refs["bomb"], "--name", "bomb")
        assert bomb.returncode == 1 and "decompression bomb" in " ".join(bomb.stderr.split()), bomb.stderr
        assert_nothing_half_made(images_daemon, before)
    finally:
        images_daemon.stop()
        images_daemon.start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_import_through_a_daemon_over_tcp_lands_on_the_daemons_machine(made: dict[str, str], tmp_path: Path) -> None:
    """Only the daemon writes images: a client elsewhere (its own home, the daemon over TCP with a token)
    uploads a local archive and an OCI layout; both land in the daemon's image directory, none in the client's."""
    daemon = Daemon(new_home("tcp-images"))
    daemon.paths = Paths(daemon.paths.home, daemon.paths.home / "images")
    link_tree(default_image(), daemon.paths.images / default_image().name)
    port = free_port()
    daemon.sticky_env["STASIS_TOKEN"] = "tcp-images-token"
    daemon.start("--tcp", f"127.0.0.1:{port}")
    client_home = tmp_path / "client-home"
    env = {**os.environ, "STASIS_HOME": str(client_home), "STASIS_URL": f"http://127.0.0.1:{port}",
           "STASIS_TOKEN": "tcp-images-token"}  # fmt: skip
    env.pop("STASIS_IMAGE_DIR", None)
    try:
        for ref, name in ((made["docker-archive"], "over-tcp"), (made["oci"], "layout-over-tcp")):
            result = subprocess.run([sys.executable, "-m", "stasis", "image", "import", ref, "--name", name],
                                    env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
            assert result.returncode == 0, result.stderr
        assert {"over-tcp", "layout-over-tcp"} <= {i.name for i in store_of(daemon).list()}
        assert not (client_home / "images").exists() or not any((client_home / "images").iterdir())
        with daemon.client() as client:
            sbx = Sandbox.create(image="over-tcp", memory_mb=256, client=client)
            assert sbx.run("cat /srv/app/hello.txt").stdout == "from the image\n"
            sbx.terminate()
    finally:
        terminate_all(daemon)
        daemon.stop()
