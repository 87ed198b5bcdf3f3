"""A built-in image not built on this host yet is built on its first use: the SDK asks the daemon to build it,
logs what and why, then creates the sandbox; any other missing image is still the error it was."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

import httpx
import pytest

from stasis import AsyncClient, AsyncSandbox, ImageNotFound, InvalidRequest
from stasis.daemon.app import create_app
from stasis.daemon.core.service import SandboxService
from stasis.images import ImageStore
from tests.fakes import FakeBackend
from tests.fastkit import fake_home, over_tcp

pytestmark = pytest.mark.fast

# mmdebstrap's stand-in (the fake backend never mounts an image): the tree it would make, at its last argument
MMDEBSTRAP = """#!/bin/sh
for target; do :; done
mkdir -p "$target/usr/bin" && echo "I: made $target"
"""


def test_a_built_in_image_is_built_on_its_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "mmdebstrap").write_text(MMDEBSTRAP)
    (tools / "mmdebstrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.delenv("STASIS_APT_MIRROR", raising=False)

    async def main() -> None:
        paths = fake_home("first-use")
        store = ImageStore(paths.images)
        shutil.rmtree(paths.images / store.recipe("default").key)  # a new host: no image built yet
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        app = create_app(paths, service=service)
        async with app.router.lifespan_context(app):
            client = AsyncClient(paths=paths)
            client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stasis")
            try:
                with caplog.at_level(logging.INFO, logger="stasis.sdk._async"):
                    sbx = await AsyncSandbox.create("first", backend="fake", client=client)
                assert (await sbx.run("echo here")).stdout == "here\n"
                assert "image 'default' is not built on this host yet: building it now" in caplog.text
                assert "default: I: made" in caplog.text  # the build's own lines, as they came
                assert store.get("default").name == "default"
                caplog.clear()
                with caplog.at_level(logging.INFO, logger="stasis.sdk._async"):
                    again = await AsyncSandbox.create("second", backend="fake", client=client)
                assert "not built" not in caplog.text  # built once
                with pytest.raises(InvalidRequest, match="unknown image 'no-such-image'"):
                    await AsyncSandbox.create("third", image="no-such-image", backend="fake", client=client)
                await again.terminate()
                await sbx.terminate()
            finally:
                await client.aclose()

    asyncio.run(main())


def test_a_teams_key_builds_no_image_and_is_told_the_owner_builds_it(tmp_path: Path) -> None:
    """A team's key may not build images (minutes of the host's CPU, gigabytes of its disk): its create says the
    image is not built yet and how it is, as before, and nothing is built."""
    token = "first-use-owner"

    async def scenario(http: httpx.AsyncClient, service: SandboxService) -> None:
        owner = {"authorization": f"Bearer {token}"}
        await http.post("/v1/teams", json={"name": "red"}, headers=owner)
        key = (await http.post("/v1/keys", json={"team": "red"}, headers=owner)).json()["key"]
        store = ImageStore(service.paths.images)
        shutil.rmtree(service.paths.images / store.recipe("default").key)
        client = AsyncClient(paths=service.paths, url="http://127.0.0.1:8000", token=key)
        await client._http.aclose()
        client._http = httpx.AsyncClient(transport=http._transport, base_url="http://127.0.0.1:8000",
                                         headers={"authorization": f"Bearer {key}"})  # fmt: skip
        try:
            with pytest.raises(ImageNotFound, match="not built yet; run `stasis image build default`"):
                await AsyncSandbox.create("red-first", backend="fake", client=client)
        finally:
            await client.aclose()
        assert not (service.paths.images / store.recipe("default").key).exists()

    over_tcp("first-use-team", token, scenario)
