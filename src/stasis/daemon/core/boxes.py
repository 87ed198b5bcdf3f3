"""What a backend is handed about a sandbox (its :class:`BoxRef`), and what its image says commands run
with: facts derived from the store's record, the image store and the network engine."""

from __future__ import annotations

from pathlib import Path

from ... import hostpath
from ...backends.base import BoxRef
from ...errors import StasisError
from ...images import ImageStore, runtime
from ...images.oci import ImageConfig
from ...models import SandboxInfo
from ...network.engine import NetworkEngine
from ...paths import Paths


class Boxes:
    def __init__(self, paths: Paths, images: ImageStore, network: NetworkEngine) -> None:
        self.paths = paths
        self.images = images
        self.network = network
        self._image_configs: dict[str, ImageConfig | None] = {}

    def directory(self, sandbox_id: str) -> Path:
        return hostpath.child(self.paths.sandboxes, sandbox_id, "sandbox id", hostpath.SANDBOX_ID)

    def box(self, info: SandboxInfo, image_rootfs: Path | None = None) -> BoxRef:
        key = info.image_key or self.images.get(info.spec.image).key
        return BoxRef(
            id=info.id,
            hostname=info.name or info.id,
            spec=info.spec,
            directory=self.directory(info.id),
            image_key=key,
            image_rootfs=image_rootfs or self.images.rootfs_by_key(key),
            state=info.runtime,
            network=self.network.net(info.id) if info.spec.network else None,
            python=self.images.by_key(key).python if image_rootfs is None else "/usr/bin/python3",
        )

    def box_or_bare(self, info: SandboxInfo) -> BoxRef:
        """A BoxRef even if the image is gone: stopping and destroying must always work."""
        try:
            return self.box(info)
        except StasisError:
            return self.box(info.model_copy(update={"image_key": info.image_key or "gone"}), Path("/"))

    def python_argv(self, info: SandboxInfo) -> list[str]:
        """How to start python3 in the sandbox: the image's, or stasis's own (an image without one)."""
        try:
            python = self.images.by_key(info.image_key or "").python
        except StasisError:
            python = "/usr/bin/python3"
        return [python] if python else runtime.argv_prefix()

    def command_defaults(self, info: SandboxInfo) -> tuple[dict[str, str], str | None, str | None]:
        """The env, working directory and user its image asks commands to run with (an imported image's
        Env, WorkingDir and User); nothing for a built-in recipe's."""
        key = info.image_key or ""
        if key not in self._image_configs:
            try:
                self._image_configs[key] = self.images.by_key(key).config
            except StasisError:
                self._image_configs[key] = None
        config = self._image_configs[key]
        return (config.env, config.working_dir, config.user) if config else ({}, None, None)
