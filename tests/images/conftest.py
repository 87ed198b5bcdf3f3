"""Fixtures of the image tests: images made offline, and a daemon with an image directory of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from stasis.images.layers import link_tree
from stasis.paths import Paths
from tests.conftest import Daemon, new_home, terminate_all
from tests.images.ociimages import archive, default_image, oci_layout, python_rootfs

ENV = {"GREETING": "hello from the image", "PATH": "/usr/local/bin:/usr/bin:/bin"}


def stasis(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stasis", *args], env={**os.environ, **daemon.env},
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    work = tmp_path_factory.mktemp("oci")
    rootfs = python_rootfs(work / "rootfs")
    layout = work / "layout"
    refs = {"oci": oci_layout(rootfs, layout, "v1", env=ENV, workdir="/srv/app", user="app")}
    refs["v2"] = oci_layout(rootfs, layout, "v2", env={**ENV, "GREETING": "v2"}, workdir="/srv/app")
    refs["arm64"] = oci_layout(rootfs, layout, "arm", env=ENV, architecture="arm64")
    refs["docker-archive"] = archive(refs["oci"], "docker-archive", work / "app-docker.tar")
    refs["oci-archive"] = archive(refs["oci"], "oci-archive", work / "app-oci.tar")
    bare = python_rootfs(work / "bare", with_python=False)
    refs["no-python"] = oci_layout(bare, work / "bare-layout", "v1", env=ENV)
    (work / "corrupt.tar").write_bytes(os.urandom(4096))
    refs["corrupt"] = f"docker-archive:{work / 'corrupt.tar'}"
    return refs


@pytest.fixture(scope="module")
def images_daemon() -> Iterator[Daemon]:
    """A daemon whose image directory is its own (imports never touch the user's image cache)."""
    daemon = Daemon(new_home("images"))
    daemon.paths = Paths(daemon.paths.home, daemon.paths.home / "images")
    default = default_image()  # what stasis's own python is made from
    link_tree(default, daemon.paths.images / default.name)
    daemon.start()
    yield daemon
    terminate_all(daemon)
    daemon.stop()


@pytest.fixture(scope="module")
def imported(images_daemon: Daemon, made: dict[str, str]) -> str:
    result = stasis(images_daemon, "image", "import", made["docker-archive"], "--name", "pyapp")
    assert result.returncode == 0, result.stderr
    return "pyapp"
