"""E2B's Template build API through the official `e2b` Python SDK, unchanged: a template with COPY, RUN, ENV, WORKDIR,
USER and start and ready commands is built by stasis' builder, rebuilt with its last step changed (only that step
runs again), tagged, and started by ``name:tag``; a failing step says which and why; the upload URL authorizes one
upload and nothing else.

One gVisor listener (a build's steps always run in gVisor; the warm template is the face's backend's).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template, wait_for_url
from e2b.exceptions import BuildException

from tests.conftest import Daemon
from tests.e2b.test_python_sdk import Listener, e2b, one_listener  # noqa: F401 (e2b: the fixture, over this listener)

CACHED = "CACHED "
JS = Path(__file__).parent / "js"


listener = one_listener("gvisor")


@pytest.fixture(scope="module", autouse=True)
def forget_built(listener: Listener) -> Iterator[None]:
    """The templates this module built, gone after it with their images: the image directory is shared."""
    yield
    api = httpx.Client(
        base_url=listener.exports["E2B_API_URL"], headers={"X-API-Key": listener.exports["E2B_API_KEY"]}, timeout=300
    )  # a warm template's memory and its images go: seconds on a loaded host
    for template in api.get("/templates").json():
        api.delete(f"/templates/{template['templateID']}")


def context(root: Path) -> Path:
    (root / "app" / "static").mkdir(parents=True)
    (root / "app" / "hello.txt").write_text("hello from the context\n")
    (root / "app" / "static" / "page.html").write_text("<p>served</p>\n")
    (root / "notes.md").write_text("one file, copied alone\n")
    (root / "app" / "run-id").write_text(uuid.uuid4().hex)  # this run's own: the image cache is shared across runs
    return root


def app_template(root: Path, last_step: str) -> Template:
    return (
        Template(file_context_path=str(root))
        .from_base_image()
        .copy("app", "/home/user/app")
        .copy("*.md", "/opt/docs/", user="root", mode=0o600)
        .set_envs({"GREETING": "hi"})
        .set_workdir("/home/user/app")
        .run_cmd("cat hello.txt > copied.txt && echo $GREETING > env.txt && pwd > pwd.txt && whoami > who.txt")
        .set_user("root")
        .run_cmd("whoami > /opt/root-step.txt")
        .set_user("user")
        .run_cmd(last_step)
        .set_start_cmd(
            "python3 -m http.server 8000 --directory /home/user/app/static",
            wait_for_url("http://127.0.0.1:8000/page.html"),
        )
    )


def messages(logs: list) -> list[str]:  # type: ignore[type-arg]
    return [entry.message for entry in logs]


def test_a_template_is_built_rebuilt_from_cache_and_started_by_tag(e2b: Listener, tmp_path: Path) -> None:  # noqa: F811
    root = context(tmp_path)
    first: list = []  # type: ignore[type-arg]
    built = Template.build(app_template(root, "echo one > last.txt"), "stasis-app:v1", on_build_logs=first.append)
    assert built.tags == ["v1"] and built.template_id
    steps = [m for m in messages(first) if m.startswith("[")]
    assert len(steps) == 9 and not any(CACHED in m for m in steps), steps  # a first build runs every step

    sbx = Sandbox.create("stasis-app:v1")
    try:
        read = sbx.files.read
        assert read("/home/user/app/copied.txt") == "hello from the context\n"  # COPY of a folder, then RUN in it
        assert read("/home/user/app/env.txt") == "hi\n" and read("/home/user/app/pwd.txt") == "/home/user/app\n"
        assert read("/home/user/app/who.txt") == "user\n" and read("/opt/root-step.txt") == "root\n"  # USER
        assert read("/home/user/app/last.txt") == "one\n"
        copied = sbx.commands.run("stat -c '%U %a' /opt/docs/notes.md", user="root").stdout
        assert copied == "root 600\n"  # COPY's user and mode, of a wildcard's match
        # the start command was running when the template was kept: the server answers at once
        assert sbx.commands.run("curl -s http://127.0.0.1:8000/page.html").stdout == "<p>served</p>\n"
        assert sbx.commands.run("whoami").stdout == "user\n"
    finally:
        sbx.kill()

    second: list = []  # type: ignore[type-arg]
    Template.build(app_template(root, "echo two > last.txt"), "stasis-app:v2", on_build_logs=second.append)
    steps = [m for m in messages(second) if m.startswith("[")]
    assert [CACHED in m for m in steps] == [True] * 8 + [False], steps  # only the changed last step ran again

    tags = {t.tag: t.build_id for t in Template.get_tags("stasis-app")}
    assert set(tags) == {"v1", "v2"} and tags["v1"] != tags["v2"]
    assert Template.exists("stasis-app") and not Template.exists("no-such-template")
    assigned = Template.assign_tags("stasis-app:v2", "prod")
    assert assigned.tags == ["prod"] and assigned.build_id == tags["v2"]
    for ref, last in (("stasis-app:prod", "two\n"), ("stasis-app:v1", "one\n")):
        sbx = Sandbox.create(ref)
        try:
            assert sbx.files.read("/home/user/app/last.txt") == last
        finally:
            sbx.kill()
    Template.remove_tags("stasis-app", "prod")
    with pytest.raises(Exception, match="no tag"):
        Sandbox.create("stasis-app:prod")


def test_a_failing_step_says_which_and_why(e2b: Listener) -> None:  # noqa: F811
    logs: list = []  # type: ignore[type-arg]
    failing = Template().from_base_image().run_cmd("echo fine").run_cmd("echo about to fail; exit 3")
    with pytest.raises(BuildException, match="exit code 3"):
        Template.build(failing, "stasis-failing", on_build_logs=logs.append)
    assert "about to fail" in messages(logs)
    with pytest.raises(BuildException, match="no registry"):  # an image stasis does not have: said, not hung
        Template.build(Template().from_image("registry.invalid/nothing:1"), "stasis-unpulled")
    with pytest.raises(Exception, match="no tag"):  # a template whose build never finished has nothing to start
        Sandbox.create("stasis-failing")


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def test_an_upload_url_takes_one_upload_that_never_writes_outside(e2b: Listener, daemon: Daemon) -> None:  # noqa: F811
    api = httpx.Client(base_url=e2b.exports["E2B_API_URL"], headers={"X-API-Key": e2b.exports["E2B_API_KEY"]})
    made = api.post("/v3/templates", json={"name": "stasis-hostile"}).json()
    template_id, build_id = made["templateID"], made["buildID"]
    files_hash = "ab" * 32
    link = api.get(f"/templates/{template_id}/files/{files_hash}").json()
    assert link["present"] is False and "signature=" in link["url"]
    escape = tarfile.TarInfo("../../escaped.txt")
    link_out = tarfile.TarInfo("app/etc-link")
    link_out.type, link_out.linkname = tarfile.SYMTYPE, "/etc"
    here, climb = tarfile.TarInfo("app/d"), tarfile.TarInfo("app/e")  # d -> . then e -> d/d/../..: out, in steps
    here.type, here.linkname, climb.type, climb.linkname = tarfile.SYMTYPE, ".", tarfile.SYMTYPE, "d/d/../.."
    hostile = _tar([(escape, b"outside\n"), (link_out, b""), (here, b""), (climb, b"")])
    plain = httpx.Client()
    assert plain.put(link["url"].replace("signature=", "signature=0"), content=hostile).status_code == 401
    other = link["url"].replace(files_hash, "cd" * 32)  # the signature covers one hash
    assert plain.put(other, content=hostile).status_code == 401
    assert plain.put(link["url"], content=hostile).status_code == 201  # no API key: the URL is the credential
    assert plain.put(link["url"], content=b"replaced").status_code == 200  # present: never replaced
    assert api.get(f"/templates/{template_id}/files/{files_hash}").json() == {"present": True}
    step = {"type": "COPY", "args": ["app", "/opt/app"], "filesHash": files_hash}
    started = api.post(f"/v2/templates/{template_id}/builds/{build_id}", json={"steps": [step]})
    assert started.status_code == 202
    status = {"status": "building"}
    while status["status"] in ("waiting", "building"):
        time.sleep(0.2)
        status = api.get(f"/templates/{template_id}/builds/{build_id}/status").json()
    assert status["status"] == "error" and "escaped.txt' leaves the directory" in status["reason"]["message"], status
    home = Path(daemon.env["STASIS_HOME"])
    assert not list(home.rglob("escaped.txt"))
    again = api.post(f"/v2/templates/{template_id}/builds/{build_id}", json={"steps": []})
    assert again.status_code == 400 and "started already" in again.json()["message"]
    fresh = api.post("/v3/templates", json={"name": "stasis-hostile"}).json()
    assert fresh["templateID"] == template_id and fresh["buildID"] != build_id  # one name, one template
    unknown = {"type": "ARG", "args": ["X"]}
    refused = api.post(f"/v2/templates/{template_id}/builds/{fresh['buildID']}", json={"steps": [unknown]})
    assert refused.status_code == 400 and "not a step stasis builds" in refused.json()["message"]
    reserved = api.post("/v3/templates", json={"name": "base"})  # E2B's own names stay the face's
    assert reserved.status_code == 400 and "E2B's own templates" in reserved.json()["message"]


def test_the_js_sdk_builds_and_starts_templates_unchanged(listener: Listener, tmp_path: Path) -> None:
    if shutil.which("node") is None or not (JS / "node_modules" / "e2b").is_dir():
        pytest.fail("node and tests/e2b/js/node_modules are missing: `make setup` installs them (npm ci)")
    env = {**listener.env, **listener.exports, "STASIS_TEMPLATE_CONTEXT": str(context(tmp_path)),
           "STASIS_TEMPLATE_NAME": f"stasis-js-{uuid.uuid4().hex[:8]}"}  # fmt: skip
    run = subprocess.run(["node", "--test", "--test-reporter=spec", "template.test.mjs"], cwd=JS, env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    assert re.search(r"^\S+ pass 2$", run.stdout, re.MULTILINE), run.stdout[-4000:]
