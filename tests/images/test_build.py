"""Building images: a Dockerfile (and the Python builder) whose steps run in build sandboxes, cached."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from stasis import BuildError, Image, InvalidRequest, Sandbox
from stasis.images import ImageStore
from stasis.images.layers import link_tree
from stasis.paths import Paths
from tests.conftest import Daemon
from tests.daemon.test_crash_recovery import crash_during
from tests.images.conftest import stasis
from tests.images.ociimages import default_image

DOCKERFILE = """\
# a comment, and a continued line below
FROM pyapp
ARG FLAVOUR=plain
ENV MODE=test \\
    FLAVOUR=${FLAVOUR} BUILT_FOR={backend}
WORKDIR /srv/build
COPY app.txt ./
COPY pkg/ /opt/pkg/
USER root
RUN cat app.txt > copied.txt && echo "$MODE $FLAVOUR" > mode.txt && rm /srv/app/hello.txt
RUN echo {last} > /srv/build/last.txt
"""


def context(tmp_path: Path, backend: str, last: str = "one") -> Path:
    (tmp_path / "pkg" / "sub").mkdir(parents=True, exist_ok=True)
    (tmp_path / "app.txt").write_text("copied in\n")
    (tmp_path / "pkg" / "sub" / "data.bin").write_bytes(bytes(range(256)))
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.replace("{last}", last).replace("{backend}", backend))
    return tmp_path


def test_a_dockerfile_builds_and_a_changed_last_line_reruns_only_it(images_daemon: Daemon, imported: str,
                                                                     tmp_path: Path, backend: str) -> None:  # fmt: skip
    ctx = context(tmp_path, backend)
    first = stasis(images_daemon, "image", "build", "-f", str(ctx / "Dockerfile"), "-t", "built",
                   "--build-arg", "FLAVOUR=mint", str(ctx))  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "step 7/7" in first.stderr and "(cached)" not in first.stderr
    with images_daemon.client() as client:
        sbx = Sandbox.create(client=client, image="built", memory_mb=256, backend=backend)  # built on gVisor
        try:
            assert sbx.run("pwd").stdout == "/srv/build\n"
            assert sbx.run("cat copied.txt mode.txt last.txt").stdout == "copied in\ntest mint\none\n"
            assert sbx.read_file("/opt/pkg/sub/data.bin") == bytes(range(256))
            assert sbx.run("test -e /srv/app/hello.txt").exit_code == 1  # deleted by a step
            assert sbx.run("id -u").stdout == "0\n"  # USER root
        finally:
            sbx.terminate()
    context(tmp_path, backend, last="two")
    steps: list[tuple[int, bool]] = []
    info = Image.from_dockerfile(ctx / "Dockerfile", ctx, {"FLAVOUR": "mint"}).build(
        "built", client=images_daemon.client(), on_step=lambda n, total, text, cached: steps.append((n, cached))
    )
    assert steps == [(1, True), (2, True), (3, True), (4, True), (5, True), (6, True), (7, False)]
    with images_daemon.client() as client:
        sbx = Sandbox.create(client=client, image="built", memory_mb=256)
        try:
            assert sbx.run("cat last.txt copied.txt").stdout == "two\ncopied in\n"
        finally:
            sbx.terminate()
    parent = ImageStore(images_daemon.paths.images).get("pyapp")
    python = Path(parent.path) / "rootfs/usr/bin/python3.11"
    assert (Path(info.path) / "rootfs/usr/bin/python3.11").stat().st_ino == python.stat().st_ino  # shared, not copied


def wheel(directory: Path) -> Path:
    """A pure-Python wheel, made by hand (no build tools needed)."""
    path = directory / "hellowheel-1.0-py3-none-any.whl"
    files = {
        "hellowheel/__init__.py": "GREETING = 'hi from a wheel'\n",
        "hellowheel-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hellowheel\nVersion: 1.0\n",
        "hellowheel-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(
            "hellowheel-1.0.dist-info/RECORD", "".join(f"{n},,\n" for n in [*files, "hellowheel-1.0.dist-info/RECORD"])
        )
    return path


def test_the_python_builder_pip_installs_a_wheel_copied_in(images_daemon: Daemon, tmp_path: Path) -> None:
    default = default_image()  # the default image, shared by hard links
    own = images_daemon.paths.images / default.name
    if not own.exists():
        link_tree(default, own)
    made = wheel(tmp_path)
    image = (Image.debian().copy(str(made), "/tmp/wheels/").pip_install("/tmp/wheels/" + made.name,
             extra_args="--no-index").env({"APP": "wheel"}))  # fmt: skip
    image = Image(image.base, image.steps, tmp_path)
    image.build("wheeled", client=images_daemon.client())
    with images_daemon.client() as client:
        sbx = Sandbox.create(client=client, image="wheeled", memory_mb=256)
        try:
            code = "import hellowheel, os; print(hellowheel.GREETING, os.environ['APP'])"
            assert sbx.run(["python3", "-c", code]).stdout == "hi from a wheel wheel\n"
        finally:
            sbx.terminate()


def test_bad_builds_are_clear_errors_and_leave_no_image(images_daemon: Daemon, imported: str, tmp_path: Path) -> None:
    store = ImageStore(images_daemon.paths.images)
    before = {i.key for i in store.list()}
    (tmp_path / "Dockerfile").write_text("FROM pyapp\nEXPOSE 80\n")
    with pytest.raises(InvalidRequest, match="line 2: EXPOSE is not supported"):
        Image.from_dockerfile(tmp_path / "Dockerfile")
    missing = Image.from_image("pyapp").copy("nope.txt", "/srv/")
    with pytest.raises(InvalidRequest, match=r"COPY nope\.txt: no such file"):
        Image(missing.base, missing.steps, tmp_path).build("bad", client=images_daemon.client())
    failing = Image.from_image("pyapp").run("echo about to fail; exit 3")
    with pytest.raises(BuildError, match=r"(?s)exit code 3.*about to fail") as plain:
        failing.build("bad", client=images_daemon.client())
    assert "network" not in str(plain.value)
    offline = Image.from_image("pyapp").run("python3 -c \"import socket; socket.getaddrinfo('deb.debian.org', 80)\"")
    with pytest.raises(BuildError, match=r"no network unless asked: Image\.build\(\.\.\., network=True"):
        offline.build("bad", client=images_daemon.client())  # no network device: the lookup fails in the sandbox
    with pytest.raises(Exception, match="unknown image 'no-such-base'"):
        Image.from_image("no-such-base").run("true").build("bad", client=images_daemon.client())
    hung = Image.from_image("pyapp").run("echo started; sleep 600")  # a build has a time limit: it never hangs
    with pytest.raises(BuildError, match="still running when the build's time ran out"):
        hung.build("bad", client=images_daemon.client(), timeout=3)
    assert not [i for i in store.list() if i.name == "bad"]
    assert {i.key for i in store.list()} - before <= {i.key for i in store.list() if i.name == "build-cache"}
    with images_daemon.client() as client:
        assert Sandbox.list(client=client) == []  # no build sandbox left behind


def test_a_daemon_killed_while_committing_a_step_leaves_no_image(own_daemon: Daemon, tmp_path: Path) -> None:
    own_daemon.paths = Paths(own_daemon.paths.home, own_daemon.paths.home / "images")
    default = default_image()
    link_tree(default, own_daemon.paths.images / default.name)
    own_daemon.start(STASIS_KILL_POINT="image.commit.before_rename")
    image = Image.debian().run("echo built > /root/built.txt")
    client = own_daemon.client()
    client.autostart = False  # the daemon is meant to stay dead until the test restarts it
    crash_during(own_daemon, lambda: image.build("halfway", client=client))
    store = ImageStore(own_daemon.paths.images)
    assert [i.key for i in store.list()] == [default.name]  # nothing half-made is visible
    with own_daemon.client() as client:
        for info in Sandbox.list(client=client):  # the build sandbox the killed daemon left
            Sandbox(info, client).terminate()
    image.build("halfway", client=own_daemon.client())  # built again from scratch, the leftovers swept
    assert not [p for p in own_daemon.paths.images.iterdir() if p.name.startswith(".")]
    with own_daemon.client() as client:
        sbx = Sandbox.create(client=client, image="halfway", memory_mb=256)
        assert sbx.read_file("/root/built.txt") == b"built\n"
        sbx.terminate()


def test_copy_keeps_a_link_in_the_context_as_a_link_and_never_reads_the_host_file(
    images_daemon: Daemon, imported: str, tmp_path: Path
) -> None:
    """As Docker does: a link inside a copied directory is copied as a link. Its target on the build host
    (a secret outside the context) is never read into the image."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret 5f3a\n")
    ctx = tmp_path / "ctx"
    (ctx / "data").mkdir(parents=True)
    (ctx / "data" / "plain.txt").write_text("plain\n")
    (ctx / "data" / "leak").symlink_to(secret)
    (ctx / "data" / "rel").symlink_to("plain.txt")
    (ctx / "Dockerfile").write_text("FROM pyapp\nCOPY data /srv/data\n")
    built = stasis(images_daemon, "image", "build", "-f", str(ctx / "Dockerfile"), "-t", "linked", str(ctx))
    assert built.returncode == 0, built.stderr
    with images_daemon.client() as client:
        sbx = Sandbox.create(client=client, image="linked", memory_mb=256)
        try:
            assert sbx.run("readlink /srv/data/leak").stdout == f"{secret}\n"
            assert sbx.run("cat /srv/data/rel").stdout == "plain\n"
            assert sbx.run(f"cat /srv/data/leak; grep -r 5f3a /srv/data {secret}").stdout == ""
        finally:
            sbx.terminate()
