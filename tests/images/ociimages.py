"""OCI images made by a test, offline: a small root filesystem with python3 (taken from the default
image: the interpreter, its standard library and the libraries they link) and busybox, packed with
umoci, turned into archives with skopeo."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from stasis.images.recipe import RECIPES
from tests.conftest import IMAGE_DIR

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "id", "pwd", "env", "echo", "sleep", "mkdir", "rm", "test", "true", "ps", "whoami")
SKIPPED_STDLIB = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "__pycache__")


def default_image() -> Path:
    """The current build of the default recipe (make setup builds it)."""
    return IMAGE_DIR / RECIPES["default"].key


def default_rootfs() -> Path:
    return default_image() / "rootfs"


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def python_rootfs(dest: Path, with_python: bool = True) -> Path:
    """A merged-/usr root filesystem: busybox applets, and (``with_python``) python3 with what it links."""
    source = default_rootfs()
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        (dest / target).mkdir(parents=True, exist_ok=True)
        (dest / link).symlink_to(target)
    shutil.copy2(BUSYBOX, dest / "usr/bin/busybox")
    for applet in APPLETS:
        (dest / "usr/bin" / applet).symlink_to("busybox")
    if with_python:
        shutil.copy2(source / "usr/bin/python3.11", dest / "usr/bin/python3.11")
        (dest / "usr/bin/python3").symlink_to("python3.11")
        shutil.copytree(source / "usr/lib/python3.11", dest / "usr/lib/python3.11", symlinks=True,
                        ignore=shutil.ignore_patterns(*SKIPPED_STDLIB))  # fmt: skip
        script = "for f in /usr/bin/python3.11 /usr/lib/python3.11/lib-dynload/*.so; do ldd $f; done"
        listed = subprocess.run(["chroot", str(source), "sh", "-c", script], capture_output=True, text=True).stdout
        libraries = {part for line in listed.splitlines() for part in line.split() if part.startswith("/")}
        for library in libraries:
            target = dest / library.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / os.path.realpath(source / library.lstrip("/")).removeprefix(str(source) + "/"),
                         target)  # fmt: skip
    etc = dest / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\napp:x:1000:\n")
    for home, owner in (("root", 0), ("home/app", 1000), ("srv/app", 1000)):
        (dest / home).mkdir(parents=True)
        os.chown(dest / home, owner, owner)
    (dest / "srv/app/hello.txt").write_text("from the image\n")
    return dest


def oci_layout(rootfs: Path, layout: Path, tag: str, *, env: dict[str, str], workdir: str | None = None,
               user: str | None = None, architecture: str = "amd64") -> str:  # fmt: skip
    """An OCI layout holding ``rootfs`` as one layer, with that config; returns ``oci:LAYOUT:TAG``."""
    if not (layout / "index.json").exists():
        _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = layout.parent / f"bundle-{tag}"
    _run("umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle))
    _run("cp", "-a", f"{rootfs}/.", str(bundle / "rootfs"))
    _run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    shutil.rmtree(bundle)
    config = ["umoci", "config", "--image", f"{layout}:{tag}", f"--architecture={architecture}"]
    config += [f"--config.env={key}={value}" for key, value in env.items()]
    config += [f"--config.workingdir={workdir}"] if workdir else []
    config += [f"--config.user={user}"] if user else []
    _run(*config, "--config.cmd=python3")
    return f"oci:{layout}:{tag}"


def archive(ref: str, kind: str, dest: Path) -> str:
    """``ref`` written as an oci-archive or docker-archive file; returns that reference."""
    target = f"{kind}:{dest}" + (":stasis-test/app:latest" if kind == "docker-archive" else "")
    _run("skopeo", "--insecure-policy", "copy", "--quiet", ref, target)
    return f"{kind}:{dest}"
