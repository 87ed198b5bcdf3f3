"""Image recipes: what goes into a root filesystem, and the hash that names the result."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field

RECIPE_FORMAT = 1  # bump when the way a recipe is turned into a root filesystem changes


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    suite: str = "bookworm"
    variant: str = "apt"
    packages: tuple[str, ...] = Field(default_factory=tuple)
    # pinned pure-Python wheels from PyPI, fetched on the host and installed into the tree (none: Debian's only)
    wheels: tuple[str, ...] = Field(default_factory=tuple)
    after: tuple[str, ...] = Field(default_factory=tuple)  # commands run in the tree (chroot) after the wheels

    @property
    def digest(self) -> str:
        fields = self.model_dump(exclude={"name"} | {k for k in ("wheels", "after") if not getattr(self, k)})
        canonical = json.dumps(
            {"format": RECIPE_FORMAT, **fields, "packages": sorted(self.packages)},  # a recipe without wheels
            sort_keys=True,  # keeps the digest (and so the build) it had before they existed
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def key(self) -> str:
        """Directory name of the built image: readable name plus content hash."""
        return f"{self.name}-{self.digest[:12]}"


DEFAULT_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "git",
    "tmux",
    "procps",
    "curl",
    "ca-certificates",
    "build-essential",
    "openssh-server",  # `stasis ssh`: run per connection as `sshd -i`, never as a daemon
    "rsync",
)

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(name="default", packages=DEFAULT_PACKAGES),
        Recipe(name="minimal", packages=("python3", "procps")),
        Recipe(
            name="code-interpreter",  # `Sandbox.run_code`: Jupyter kernels and the usual analysis stack, from Debian
            packages=(
                *DEFAULT_PACKAGES,
                "python3-ipykernel",
                "python3-jupyter-client",
                "python3-matplotlib",
                "python3-matplotlib-inline",
                "python3-numpy",
                "python3-pandas",
                "python3-pexpect",
                "fonts-dejavu-core",
            ),
            wheels=("bash_kernel==0.10.0", "filetype==1.2.0"),  # a bash kernel: PyPI has it, Debian does not
            after=("python3 -m bash_kernel.install --sys-prefix",),
        ),
        Recipe(
            name="desktop",  # computer use (stasis.desktop): a screen, a window manager, Chromium, a VNC server
            packages=(
                *DEFAULT_PACKAGES,
                "xvfb",
                "x11vnc",
                "openbox",
                "chromium",
                "xterm",
                "xdotool",
                "x11-utils",
                "scrot",
                "fonts-dejavu-core",
            ),
        ),
    )
}
