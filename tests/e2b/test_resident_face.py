"""E2B's face served by the daemon itself (`stasis serve --e2b HOST:PORT`): it comes back with the daemon, on the
same address with the same key, so a connected E2B client's next call after a restart succeeds."""

from __future__ import annotations

import socket

import httpx
from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox

from stasis import Client, ImageNotFound, Template
from stasis import Sandbox as StasisSandbox
from stasis.e2b_wire import code_template_name
from stasis.sdk.e2b import BASE_IMAGE
from stasis.sdk.image import get_image
from tests.conftest import Daemon, new_home, terminate_all, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def has_image(client: Client, name: str) -> bool:
    try:
        get_image(name, client=client)
    except ImageNotFound:
        return False
    return True


def exports_of(daemon: Daemon) -> dict[str, str]:
    text = (daemon.paths.home / "e2b-exports").read_text()
    assert (daemon.paths.home / "e2b-exports").stat().st_mode & 0o777 == 0o600
    return dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines() if line.startswith("export "))


def test_a_connected_e2b_client_goes_on_after_the_daemon_restarts() -> None:
    daemon = Daemon(new_home("e2b-resident"))
    face = f"127.0.0.1:{free_port()}"
    daemon.start("--e2b", face)
    sbx = None
    try:
        exports = exports_of(daemon)
        assert exports["E2B_API_URL"] == f"http://{face}"
        port = face.rpartition(":")[2]
        assert f"PORT-SANDBOXID.localhost:{port}" in (daemon.paths.home / "e2b-exports").read_text()
        with daemon.client() as client:  # the daemon builds the base template's image once, in the background
            wait_until(lambda: has_image(client, BASE_IMAGE), timeout=600)
        opts = {"api_key": exports["E2B_API_KEY"], "api_url": exports["E2B_API_URL"],
                "sandbox_url": exports["E2B_SANDBOX_URL"]}  # fmt: skip
        with daemon.client() as client:  # and code-interpreter-v1's warm template, once, in the background
            wait_until(lambda: code_template_name("gvisor") in {t.name for t in Template.list(client)}, timeout=900)
        interpreter = CodeSandbox.create(timeout=600, **opts)
        try:
            assert interpreter.run_code("6 * 7").text == "42"
            with daemon.client() as client:  # warm: started from the template, its kernel server already running
                warm = StasisSandbox.connect(interpreter.sandbox_id, client=client).list_processes()
                assert "template-start" in {p.name for p in warm}
        finally:
            interpreter.kill()
        sbx = Sandbox.create(timeout=900, **opts)
        sbx.commands.run("echo kept > note")
        # get_host names a host this machine resolves (*.localhost) and the listener routes by its Host
        sbx.commands.run("echo served > index.html && exec python3 -m http.server 8000", background=True)
        host = sbx.get_host(8000)
        assert host == f"{8000}-{sbx.sandbox_id}.localhost:{port}"
        token = {"e2b-traffic-access-token": sbx.traffic_access_token or ""}
        wait_until(lambda: httpx.get(f"http://{host}/index.html", headers=token, timeout=60).status_code == 200)
        assert httpx.get(f"http://{host}/index.html", headers=token, timeout=60).text == "served\n"
        daemon.stop()
        daemon.start("--e2b", face)
        assert exports_of(daemon) == exports  # the same address and key
        assert sbx.commands.run("cat note; whoami").stdout == "kept\nuser\n"  # the same client object, next call
        assert sbx.sandbox_id in {s.sandbox_id for s in Sandbox.list(**opts).next_items()}
    finally:
        if sbx is not None:
            sbx.kill()
        terminate_all(daemon)
        daemon.stop()
