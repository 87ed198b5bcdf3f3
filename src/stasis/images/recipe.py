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

    @property
    def digest(self) -> str:
        canonical = json.dumps(
            {"format": RECIPE_FORMAT, **self.model_dump(exclude={"name"}), "packages": sorted(self.packages)},
            sort_keys=True,
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
                "fonts-dejavu-core",
            ),
        ),
    )
}
