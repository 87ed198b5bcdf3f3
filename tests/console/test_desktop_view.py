"""The console's live view of a desktop, in a real browser (Playwright + Debian's chromium): noVNC shows the
sandbox's screen, watches without acting, and acts once control is taken. View-only is the server's word, not
the page's: a client that sends a click on the view-only connection itself changes nothing."""

from __future__ import annotations

import contextlib
import io
import re
import struct
import time
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image
from playwright.sync_api import Page, expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from stasis import Sandbox
from tests.conftest import Daemon, wait_until
from tests.console.conftest import TOKEN, log_in, shoot

WIDTH, HEIGHT = 800, 600
CENTRE = (WIDTH // 2, HEIGHT // 2)
BLUE, RED = (0, 0, 255), (255, 0, 0)
# Each click anywhere toggles the whole page between blue and red: an extra click is seen as a wrong colour.
TOGGLE = """<!doctype html><html><body style="margin:0;height:100vh;background:#0000ff"><script>
let red = false;
document.body.onclick = () => { red = !red; document.body.style.background = red ? "#ff0000" : "#0000ff"; };
</script></body></html>"""
CANVAS_PIXEL = """([x, y]) => {
    const canvas = document.querySelector("#screen canvas");
    if (!canvas || canvas.width < x) return null;
    return Array.from(canvas.getContext("2d").getImageData(x, y, 1, 1).data.slice(0, 3));
}"""


@pytest.fixture(scope="module")
def desktop(console_daemon: Daemon) -> Iterator[Sandbox]:
    with console_daemon.client() as client:
        sbx = Sandbox.create("desk-view", image="desktop", screen=f"{WIDTH}x{HEIGHT}", memory_mb=2048, client=client)
        try:
            sbx.write_file("/root/toggle.html", TOGGLE)
            sbx.open("file:///root/toggle.html")
            assert_screen(sbx, BLUE)
            yield sbx
        finally:
            sbx.terminate()


def assert_screen(sbx: Sandbox, colour: tuple[int, int, int], timeout: float = 120) -> None:
    """The desktop itself (a screenshot through the API, not the view) shows ``colour`` at its centre."""
    deadline = time.monotonic() + timeout
    while True:
        with Image.open(io.BytesIO(sbx.screenshot())) as image:
            seen = image.convert("RGB").getpixel(CENTRE)
        if seen == colour:
            return
        assert time.monotonic() < deadline, f"the desktop shows {seen} at its centre, not {colour}"
        time.sleep(0.5)


def wait_for_view(page: Page, colour: tuple[int, int, int]) -> None:
    page.wait_for_function(f"(({CANVAS_PIXEL})({list(CENTRE)}) || []).join() === '{','.join(map(str, colour))}'",
                           timeout=120_000)  # fmt: skip


def test_the_live_view_shows_the_screen_and_acts_only_once_control_is_taken(
    page: Page, base: str, desktop: Sandbox
) -> None:
    log_in(page)
    page.goto(f"/ui/sandboxes/{desktop.id}")
    page.click("#open-desktop")
    expect(page.locator("#desktop-state")).to_have_attribute("data-state", "view", timeout=120_000)
    wait_for_view(page, BLUE)  # the page in the sandbox's Chromium, drawn by noVNC in the console
    shoot(page, "desktop-view-only")

    screen = page.locator("#screen canvas")
    screen.click()  # the page's own view-only mode keeps this click
    with rfb_session(base, desktop.id, control=False) as vnc:  # a client that sends it anyway
        click(vnc, *CENTRE)
    page.click("#desktop-control")
    expect(page.locator("#desktop-state")).to_have_attribute("data-state", "control", timeout=60_000)
    screen.click()  # one click in all reached the desktop: it turned red, not back to blue
    assert_screen(desktop, RED)
    wait_for_view(page, RED)
    shoot(page, "desktop-in-control")


def test_the_vnc_bridge_refuses_a_client_without_the_consoles_login(base: str, desktop: Sandbox) -> None:
    ws = base.replace("http://", "ws://") + f"/ui/sandboxes/{desktop.id}/desktop/vnc"
    with pytest.raises(InvalidStatus):
        connect(ws + "?control=1", open_timeout=30).close()
    cookie, _ = login(base, desktop.id)
    with pytest.raises(InvalidStatus):  # the session without its CSRF token: what another site's page could send
        connect(ws + "?control=1&csrf=guess", additional_headers={"cookie": cookie}, open_timeout=30).close()
    with httpx.Client(base_url=base) as http:
        assert http.get(f"/ui/sandboxes/{desktop.id}/desktop").status_code == 303  # to the login page


def test_an_open_view_keeps_the_sandbox_in_use(base: str, desktop: Sandbox) -> None:
    """While someone watches, the idle reaper leaves the sandbox alone: no idle deadline runs."""
    # the views of the tests before (a page's bridge) end on their own time: until then it is in use already
    wait_until(lambda: desktop.info().idle_action_at is not None, timeout=60)
    with rfb_session(base, desktop.id, control=False):
        assert desktop.info().idle_action_at is None
    wait_until(lambda: desktop.info().idle_action_at is not None, timeout=60)  # the bridge ends on its own time


# ---------------------------------------------------------------- a VNC client of the bridge, by hand


def login(base: str, sandbox_id: str) -> tuple[str, str]:
    """The console session's cookie and CSRF token, as the login form and the desktop page give them."""
    with httpx.Client(base_url=base) as http:
        http.post("/ui/login", data={"token": TOKEN})
        page = http.get(f"/ui/sandboxes/{sandbox_id}/desktop").text
        csrf = re.search(r'<meta name="csrf" content="([^"]+)"', page).group(1)  # type: ignore[union-attr]
        return "; ".join(f"{k}={v}" for k, v in http.cookies.items()), csrf


@contextlib.contextmanager
def rfb_session(base: str, sandbox_id: str, control: bool) -> Iterator[RfbConnection]:
    """An RFB session over the console's bridge, past the handshake (RFC 6143: no security, shared)."""
    cookie, csrf = login(base, sandbox_id)
    url = base.replace("http://", "ws://") + f"/ui/sandboxes/{sandbox_id}/desktop/vnc"
    with connect(f"{url}?csrf={csrf}&control={int(control)}", additional_headers={"cookie": cookie},
                 open_timeout=120, max_size=None) as ws:  # fmt: skip
        vnc = RfbConnection(ws)
        vnc.handshake()
        yield vnc


class RfbConnection:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws, self.buffer = ws, b""

    def read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            message = self.ws.recv(timeout=60)
            self.buffer += message if isinstance(message, bytes) else message.encode()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def handshake(self) -> None:
        assert self.read(12).startswith(b"RFB 003.")
        self.ws.send(b"RFB 003.008\n")
        (count,) = struct.unpack("B", self.read(1))
        assert 1 in self.read(count), "the desktop's VNC server asks for no password: the bridge is the gate"
        self.ws.send(b"\x01")
        assert self.read(4) == b"\x00\x00\x00\x00"
        self.ws.send(b"\x01")  # shared: the console's own view stays connected
        width, height = struct.unpack(">HH", self.read(4))
        assert (width, height) == (WIDTH, HEIGHT)
        self.read(16)  # the pixel format
        (name_length,) = struct.unpack(">I", self.read(4))
        self.read(name_length)

    def send(self, data: bytes) -> None:
        self.ws.send(data)


def click(vnc: RfbConnection, x: int, y: int) -> None:
    """A left click: PointerEvent with the button down, then up (RFC 6143 7.5.5)."""
    for mask in (1, 0):
        vnc.send(struct.pack(">BBHH", 5, mask, x, y))
    vnc.send(struct.pack(">BBHHHH", 3, 0, 0, 0, WIDTH, HEIGHT))  # and a screen update asked for, answered after
    vnc.read(1)  # the server's next message: everything sent before it was read
