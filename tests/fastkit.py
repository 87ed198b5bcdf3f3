"""The fast tier's set-up: a temporary home with a stand-in image, and a service on the FakeBackend."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx

from stasis.daemon.app import create_app
from stasis.daemon.core.recovery import Recovery
from stasis.daemon.core.service import SandboxService
from stasis.daemon.core.sources import source_of
from stasis.daemon.rooms.checkpointing import Checkpoints
from stasis.images import ImageInfo, ImageStore
from stasis.models import CreateSandboxRequest, SandboxInfo
from stasis.paths import Paths
from tests.conftest import TEST_ROOT
from tests.fakes import FakeBackend


def fake_home(name: str = "fast") -> Paths:
    """A home whose image directory holds an empty 'default' image (the fake never mounts it)."""
    TEST_ROOT.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=TEST_ROOT))
    paths = Paths(home=home, images=home / "images")
    paths.ensure()
    recipe = ImageStore(paths.images).recipe("default")
    image = paths.images / recipe.key
    (image / "rootfs").mkdir(parents=True)
    info = ImageInfo(name="default", key=recipe.key, digest=recipe.digest, packages=[], suite="none",
                     size_bytes=0, built_at=time.time(), build_seconds=0, path=str(image))  # fmt: skip
    (image / "image.json").write_text(info.model_dump_json())
    return paths


class Clock:
    """Wall-clock time the test moves on by hand (idle timers, expiries): no test sleeps through one."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextlib.asynccontextmanager
async def running_service(
    paths: Paths, *, cleanup: bool = True, clock: Clock | None = None
) -> AsyncIterator[SandboxService]:
    """A started service (recovery run, as in the app's lifespan); ``cleanup`` removes its sandboxes after."""
    service = SandboxService(paths, backends={"fake": FakeBackend(paths)}, clock=clock or time.time)
    await service.start()
    await Recovery(service, [Checkpoints(service, service.tables.checkpoints).recover]).run()
    try:
        yield service
    finally:
        if cleanup:
            for info in service.store.list():
                await service.terminate(info.id)
        await service.close()


def fake(service: SandboxService) -> FakeBackend:
    return service.backends["fake"]  # type: ignore[return-value]


async def create(service: SandboxService, name: str | None = None, **spec: object) -> SandboxInfo:
    request = CreateSandboxRequest(name=name, backend="fake", **spec)  # type: ignore[arg-type]
    return await service.create(
        name, await source_of(request, Checkpoints(service, service.tables.checkpoints), service.images)
    )


def statuses(service: SandboxService, sandbox_id: str) -> list[str]:
    return [t["to_status"] for t in service.store.transitions(sandbox_id)]


def over_tcp(name: str, token: str, scenario: Callable[[httpx.AsyncClient, SandboxService], Awaitable[None]]) -> None:
    """Run ``scenario`` against the daemon's whole app in process, on the fake backend, as a TCP client (the
    token, and team keys, are checked as over a socket); every sandbox it leaves is removed after."""

    async def main() -> None:
        paths = fake_home(name)
        service = SandboxService(paths, backends={"fake": FakeBackend(paths)})
        app = create_app(paths, token=token, service=service)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
                try:
                    await scenario(http, service)
                finally:
                    for info in service.store.list():
                        await service.terminate(info.id)

    asyncio.run(main())
