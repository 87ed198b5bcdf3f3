"""A sandbox's egress policy changed while it runs: the next connection is judged by the new one."""

from __future__ import annotations

from ...errors import Unsupported
from ...models import SandboxInfo
from ...netpolicy import NetworkPolicy
from ..core.service import SandboxService


async def update_network(core: SandboxService, ref: str, policy: NetworkPolicy) -> SandboxInfo:
    """A new egress policy, live: the next connection is judged by it."""
    info = core.lookup(ref)
    async with core.lock(info.id):
        info = core.store.get(info.id)
        if info.spec.network is None:
            raise Unsupported(
                f"sandbox {info.name or info.id!r} was created without network, so its kernel has no network "
                "device; create it with network=NetworkPolicy(...) (or `stasis create --network`) instead"
            )
        info = core.store.update_spec(info.id, info.spec.model_copy(update={"network": policy}),
                                      f"network: {policy.describe()}")  # fmt: skip
        await core.network.update(info.id, policy)
        return core.present(info)
