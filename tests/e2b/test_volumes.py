"""E2B's Volumes through the official `e2b` SDKs, unchanged: a volume created, mounted by two sandboxes, written by
one and read by the other, kept across a pause and after both are gone; its content API with the volume's token;
what a sandbox leaves in it (a link) never leads the host outside. gVisor (volumes mount there)."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import NotFoundException

from stasis import Volume as StasisVolume
from tests.e2b.test_python_sdk import Listener, e2b, one_listener  # noqa: F401 (e2b: the fixture, over this listener)

JS = Path(__file__).parent / "js"


listener = one_listener("gvisor")


def test_a_volume_is_shared_kept_across_pause_and_reached_with_its_token(e2b: Listener) -> None:  # noqa: F811
    assert e2b.exports["E2B_VOLUME_API_URL"] == e2b.exports["E2B_API_URL"]
    volume = Volume.create(f"e2b-vol-{uuid.uuid4().hex[:8]}")
    assert volume.token and volume.volume_id == volume.name
    volume.make_dir("/seed", force=True)
    volume.write_file("/seed/hello.txt", "from the content API")
    writer = Sandbox.create(volume_mounts={"/data": volume})
    reader = Sandbox.create(volume_mounts={"/mnt/shared": volume.name})
    try:
        assert writer.commands.run("cat /data/seed/hello.txt").stdout == "from the content API"
        writer.commands.run("echo from-the-writer > /data/note.txt")  # as E2B's `user`
        assert reader.files.read("/mnt/shared/note.txt") == "from-the-writer\n"
        assert volume.read_file("/note.txt") == "from-the-writer\n"
        info = volume.get_info("/note.txt")
        assert (info.size, info.uid) == (16, 1000)
        writer.pause()
        writer = Sandbox.connect(writer.sandbox_id)
        writer.commands.run("echo after-the-pause >> /data/note.txt && ln -s /etc/passwd /data/passwd")
        assert reader.files.read("/mnt/shared/note.txt") == "from-the-writer\nafter-the-pause\n"
        with pytest.raises(Exception, match="not a file"):  # a link the sandbox left: never followed by the host
            volume.read_file("/passwd")
        assert {e.name for e in volume.list("/")} == {"seed", "note.txt", "passwd"}
    finally:
        writer.kill()
        reader.kill()
    again = Volume.connect(volume.volume_id)  # after both sandboxes are gone
    assert again.read_file("/note.txt") == "from-the-writer\nafter-the-pause\n"
    changed = again.update_metadata("/note.txt", uid=0, mode=0o600)
    assert (changed.uid, changed.mode & 0o7777) == (0, 0o600)
    again.remove("/seed")
    assert not again.exists("/seed")
    with pytest.raises(Exception, match=r"401|token"):
        Volume(volume.volume_id, volume.name, token="not-the-token").read_file("/note.txt")
    content = f"{e2b.exports['E2B_VOLUME_API_URL']}/volumecontent/{volume.volume_id}/path?path=/note.txt"
    big = b'{"mode": 420, "pad": "' + b"x" * (20 << 20) + b'"}'
    assert httpx.patch(content, json={"mode": 0o600}).status_code == 401  # no token: refused, the body unread
    for headers in ({}, {"Authorization": f"Bearer {volume.token}"}):  # a JSON body is bounded, a token or not
        assert httpx.patch(content, content=big, headers=headers).status_code == 413
    StasisVolume.get(volume.name, client=e2b.daemon.client()).set_max_size(8)  # its owner sets a limit
    with pytest.raises(Exception, match="volume is full") as full:  # said, not a 500 and a reset connection
        again.write_file("/big.bin", b"x" * (32 << 20))
    assert "Internal" not in str(full.value)
    assert again.read_file("/note.txt") == "from-the-writer\nafter-the-pause\n" and not again.exists("/big.bin")
    assert volume.volume_id in {v.volume_id for v in Volume.list()}
    Volume.destroy(volume.volume_id)
    with pytest.raises(NotFoundException):
        Volume.connect(volume.volume_id)


def test_the_js_sdk_uses_volumes_unchanged(listener: Listener) -> None:
    if shutil.which("node") is None or not (JS / "node_modules" / "e2b").is_dir():
        pytest.fail("node and tests/e2b/js/node_modules are missing: `make setup` installs them (npm ci)")
    env = {**listener.env, **listener.exports, "STASIS_VOLUME_NAME": f"e2b-js-vol-{uuid.uuid4().hex[:8]}"}
    run = subprocess.run(["node", "--test", "--test-reporter=spec", "volume.test.mjs"], cwd=JS, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    assert re.search(r"^\S+ pass 1$", run.stdout, re.MULTILINE), run.stdout[-4000:]
