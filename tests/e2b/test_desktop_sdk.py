"""E2B Desktop's official Python SDK (`e2b-desktop`, pinned, from PyPI), unchanged, against `stasis e2b serve`.

The SDK starts its own X server and XFCE in the `desktop` template (stasis' image of that name) and drives them
with commands; its stream is x11vnc and noVNC's proxy, reached through the face's port proxy (a WebSocket). A
page served inside the sandbox toggles its colour at each click, so a screenshot's pixel says how many clicks
arrived; a pause keeps it, memory and all (gVisor).
"""

from __future__ import annotations

import io
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b_desktop import Sandbox
from PIL import Image
from websockets.sync.client import connect

from tests.conftest import Daemon, wait_until
from tests.e2b.test_python_sdk import Listener, opts

WIDTH, HEIGHT = 800, 600
SPOT = (WIDTH // 2, HEIGHT * 3 // 4)  # where the clicks go: in the page, below its input
SEEN = (WIDTH // 4, HEIGHT * 3 // 4)  # where its colour is read: not under the pointer (scrot --pointer draws it)
ARTIFACTS = Path(__file__).parents[2] / "build" / "test-artifacts" / "e2b-desktop"
BLUE, RED = (0, 0, 255), (255, 0, 0)
TOGGLE = """<!doctype html><html><body style="margin:0;height:100vh;background:#0000ff"><script>
let red = false;
document.body.onclick = () => { red = !red; document.body.style.background = red ? "#ff0000" : "#0000ff"; };
</script><input id="typed" autofocus style="position:fixed;top:0;left:0;width:100%;font-size:20px"
  oninput="document.title = this.value"></body></html>"""  # what is typed becomes the window's title


@pytest.fixture(scope="module")
def desktop_listener(daemon: Daemon) -> Iterator[Listener]:
    served = Listener(daemon, "gvisor", memory_mb=2048)  # Chromium and XFCE want more than the face's default
    yield served
    served.close()


@pytest.fixture(scope="module")
def desktop(desktop_listener: Listener) -> Iterator[Sandbox]:
    sbx = Sandbox.create(resolution=(WIDTH, HEIGHT), timeout=1800, **opts(desktop_listener))
    try:
        yield sbx
    finally:
        sbx.kill()


def wait_for(sbx: Sandbox, colour: tuple[int, int, int], timeout: float = 120) -> None:
    """Until the page shows ``colour``; else the last screenshot is kept in build/test-artifacts/e2b-desktop/."""
    deadline = time.monotonic() + timeout
    while True:
        png = bytes(sbx.screenshot())
        with Image.open(io.BytesIO(png)) as image:
            assert image.size == (WIDTH, HEIGHT)
            seen = image.convert("RGB").getpixel(SEEN)
        if seen == colour:
            return
        if time.monotonic() > deadline:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / f"not-{colour}.png").write_bytes(png)
            raise AssertionError(f"the page shows {seen}, not {colour}")
        time.sleep(0.5)


def test_the_sdk_opens_a_page_clicks_types_and_the_page_survives_a_pause(
    desktop: Sandbox, desktop_listener: Listener
) -> None:
    assert desktop.get_screen_size() == (WIDTH, HEIGHT)
    desktop.files.write("/root/site/toggle.html", TOGGLE)
    desktop.commands.run("cd /root/site && exec python3 -m http.server 8000", background=True)
    desktop.open("http://localhost:8000/toggle.html")  # xdg-open: the image's default browser, Chromium
    wait_for(desktop, BLUE)
    desktop.write("typed by e2b")  # into the input, which has the focus
    desktop.press("enter")
    wait_until(lambda: desktop.get_window_title(desktop.get_current_window_id()).startswith("typed by e2b"))
    desktop.left_click(*SPOT)
    wait_for(desktop, RED)
    assert desktop.get_cursor_position() == SPOT

    desktop.pause()
    again = Sandbox.connect(desktop.sandbox_id, **opts(desktop_listener))
    wait_for(again, RED, timeout=60)  # the same page, as it was: not reloaded
    assert again.get_window_title(again.get_current_window_id()).startswith("typed by e2b")
    again.left_click(*SPOT)
    wait_for(again, BLUE)


def test_the_stream_is_novnc_through_the_port_proxy_and_needs_the_token(
    desktop: Sandbox, desktop_listener: Listener
) -> None:
    desktop.stream.start()
    host = desktop.get_host(6080)
    assert desktop.stream.get_url().startswith(f"https://{host}/vnc.html")
    url = desktop_listener.exports["E2B_SANDBOX_URL"]
    headers = {"E2b-Sandbox-Id": desktop.sandbox_id, "E2b-Sandbox-Port": "6080"}
    token = {"e2b-traffic-access-token": desktop.traffic_access_token or ""}

    def page() -> httpx.Response:
        return httpx.get(f"{url}/vnc.html", headers={**headers, **token}, timeout=60)

    wait_until(lambda: page().status_code == 200, timeout=60)
    assert "noVNC" in page().text
    assert httpx.get(f"{url}/vnc.html", headers=headers, timeout=60).status_code == 401  # never without the token

    ws_url = url.replace("http://", "ws://") + "/websockify"
    with connect(ws_url, additional_headers={**headers, **token}, subprotocols=["binary"],  # type: ignore[list-item]
                 open_timeout=60) as ws:  # fmt: skip
        assert ws.subprotocol == "binary"
        assert bytes(ws.recv(timeout=60)).startswith(b"RFB 003.")  # the desktop's VNC server, through websockify
        ws.send(b"RFB 003.008\n")
        security = bytes(ws.recv(timeout=60))
        (count,) = struct.unpack("B", security[:1])
        assert count >= 1
    desktop.stream.stop()
