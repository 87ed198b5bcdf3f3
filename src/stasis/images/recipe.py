"""Image recipes: what goes into a root filesystem, and the hash that names the result."""

from __future__ import annotations

import hashlib
import json
import shlex

from pydantic import BaseModel, ConfigDict, Field

from ..desktop import GLIB_SPAWN_SHIM

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


IMAGE_PYTHON = "3.11"  # Debian bookworm's, every recipe's: the version a recipe's binary wheels are fetched for

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
E2B_USER_PACKAGES = ("sudo",)  # E2B's templates give their user passwordless sudo (the e2b-* images' sudoers line)

# Sourced by Debian's chromium wrapper, however Chromium is started (xdg-open, gtk-launch): no setuid sandbox (the
# sandbox is the sandbox); its unlinked temporary files and metrics file on the sandbox's tmpfs, where a suspend
# saves them (gVisor cannot save such a file on a disk).
CHROMIUM_DEFAULTS = (
    'export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-sandbox --disable-gpu --no-first-run --password-store=basic"',
    'export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --start-maximized"',  # the page fills the screen an agent looks at
    "export TMPDIR=/dev/shm",
    'stasis_profile="$HOME/.config/chromium"',
    'mkdir -p "$stasis_profile" /dev/shm/stasis-chromium-metrics',
    '[ -L "$stasis_profile/BrowserMetrics" ] || { rm -rf "$stasis_profile/BrowserMetrics"; '
    'ln -s /dev/shm/stasis-chromium-metrics "$stasis_profile/BrowserMetrics"; }',
)

# gVisor (runsc 20240729) answers close_range(fd, ~0U, flags) with EINVAL where Linux closes up to the last
# descriptor; GLib's g_spawn takes that for a failure, so no XFCE component starts. A close_range that asks for the
# same range with an int's maximum fixes it (runc met the same: opencontainers/runc#4596). It is preloaded only where
# GLib spawns (E2B Desktop's commands: XFCE, gtk-launch), not image-wide: a preload costs every process start ~7 ms.
CLOSE_RANGE_SHIM = (
    "#define _GNU_SOURCE",
    "#include <limits.h>",
    "#include <sys/syscall.h>",
    "#include <unistd.h>",
    "int close_range(unsigned int first, unsigned int last, int flags) {",
    "  return syscall(SYS_close_range, first, last > INT_MAX ? INT_MAX : last, flags);",
    "}",
)

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(name="default", packages=(*DEFAULT_PACKAGES, *E2B_USER_PACKAGES)),
        Recipe(name="minimal", packages=("python3", "procps")),
        Recipe(
            name="code-interpreter",  # `Sandbox.run_code`: Jupyter kernels and the usual analysis stack, from Debian
            packages=(
                *DEFAULT_PACKAGES,
                *E2B_USER_PACKAGES,
                "python3-ipykernel",
                "python3-jupyter-client",
                "python3-matplotlib",
                "python3-matplotlib-inline",
                "python3-numpy",
                "python3-pandas",
                "python3-pexpect",
                "python3-sklearn",  # E2B's template's analysis stack, as far as Debian has it
                "python3-seaborn",
                "python3-plotly",
                "python3-openpyxl",
                "python3-bs4",
                "python3-requests",
                "python3-sympy",
                "fonts-dejavu-core",
            ),
            wheels=(
                "bash_kernel==0.10.0",  # a bash kernel: PyPI has it, Debian does not
                "filetype==1.2.0",
                # E2B's chart extractor (result.chart), which works with Debian's matplotlib and numpy; it needs
                # pydantic 2 (Debian's is 1), whose core is a cp311 wheel, as this image's Python is
                "e2b-charts==1.0.0",
                "pydantic==2.10.6",
                "pydantic-core==2.27.2",
                "annotated-types==0.7.0",
                "typing-extensions==4.12.2",
            ),
            after=(
                "python3 -m bash_kernel.install --sys-prefix",
                # `pip install` (and a notebook's `!pip install`) works, as in E2B's template: this Python is the
                # sandbox's own, not Debian's to manage (PEP 668); a user's installs go to ~/.local
                "rm -f /usr/lib/python3*/EXTERNALLY-MANAGED",
            ),
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
                # what E2B Desktop's SDK runs in its sandbox: an XFCE session, xrandr, xdg-open and gtk-launch,
                # netstat, and noVNC's proxy at /opt/noVNC (its stream)
                "xfce4-session",
                "xfwm4",
                "xfdesktop4",
                "xfce4-panel",
                "dbus-x11",
                "x11-xserver-utils",
                "xdg-utils",
                "libgtk-3-bin",
                "net-tools",
                "novnc",
            ),
            after=(
                "ln -sfn /usr/share/novnc /opt/noVNC",
                "dbus-uuidgen > /etc/machine-id",  # XFCE's D-Bus session wants one
                shlex.join(["printf", "%s\\n", *CLOSE_RANGE_SHIM]) + " > /tmp/close-range.c && gcc -O2 -shared "
                f"-fPIC -o {GLIB_SPAWN_SHIM} /tmp/close-range.c && rm /tmp/close-range.c",
                shlex.join(["printf", "%s\\n", *CHROMIUM_DEFAULTS]) + " > /etc/chromium.d/stasis",
            ),
        ),
    )
}
