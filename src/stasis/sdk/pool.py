"""``Pool``: warm pools, sandboxes started ahead so that a create is a claim.

    Pool.create("py", image="default", size=4)
    Pool.wait_ready("py")
    sbx = Sandbox.create(image="default")     # claimed from "py": no boot on the way to the first exec

A create claims from a pool when it asks for the pool's image, backend, cpus, memory, disk and template
and no network; any other create boots as before. The daemon refills a pool in the background.
"""

from __future__ import annotations

import time

from ..errors import PoolNotReady
from ..models import build
from ..pool_models import CreatePoolRequest, PoolInfo
from ._base import Call, _model, _models
from ._client import Client


class Pool:
    @staticmethod
    def create(
        name: str,
        image: str = "default",
        *,
        size: int = 2,
        backend: str | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        template: str | None = None,
        client: Client | None = None,
    ) -> PoolInfo:
        fields = {"backend": backend, "cpus": cpus, "memory_mb": memory_mb, "disk_mb": disk_mb, "template": template}
        body = build(CreatePoolRequest, name=name, image=image, size=size, **{k: v for k, v in fields.items() if v})
        call = Call("POST", "/v1/pools", _model(PoolInfo), json=body.model_dump(exclude_unset=True))
        return (client or Client()).call(call)

    @staticmethod
    def list(client: Client | None = None) -> list[PoolInfo]:
        return (client or Client()).call(Call("GET", "/v1/pools", _models(PoolInfo)))

    @staticmethod
    def get(name: str, client: Client | None = None) -> PoolInfo:
        return (client or Client()).call(Call("GET", f"/v1/pools/{name}", _model(PoolInfo)))

    @staticmethod
    def remove(name: str, client: Client | None = None) -> PoolInfo:
        """The pool and every member still waiting in it; sandboxes claimed from it stay."""
        return (client or Client()).call(Call("DELETE", f"/v1/pools/{name}", _model(PoolInfo)))

    @staticmethod
    def wait_ready(name: str, timeout: float = 300.0, client: Client | None = None) -> PoolInfo:
        """Until every member of the pool is started and waiting."""
        client = client or Client()
        deadline = time.monotonic() + timeout
        while (info := Pool.get(name, client)).ready < info.spec.size:
            if time.monotonic() > deadline:
                raise PoolNotReady(
                    f"pool {name!r} has {info.ready} of {info.spec.size} members ready after {timeout:.0f}s"
                    + (f"; its last start failed: {info.last_error}" if info.last_error else "")
                )
            time.sleep(0.1)
        return info
