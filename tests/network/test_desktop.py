"""A desktop sandbox (image `desktop`): a page of a test host in its Chromium, read back by screenshots.

The page (tests/network/testhost_server.py, /desktop) paints its state as colour blocks: top left blue, red
once its button was clicked (kept in localStorage); top right blue, green while its input holds "hello"; a strip
below them grey, green when the test host saw its own login cookie. So every check is a screenshot's pixels:
what an agent sees is what the test sees.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest
from PIL import Image

from stasis import CheckpointType, Client, Sandbox
from tests.conftest import Daemon, new_home, terminate_all, wait_until
from tests.network.testhosts import TestHost
from tests.remote import conftest as remote
from tests.remote.conftest import S3

s3 = remote.s3  # the remote tests' S3 server (moto's, on loopback), as a fixture here: for the move
SCREEN = (1024, 768)
BLUE, RED, GREEN, GREY = (0, 0, 255), (255, 0, 0), (0, 255, 0), (128, 128, 128)
PAGE = "http://allowed.test/desktop"  # the web test host, by the test DNS zone
LOGIN = "http://allowed.test/desktop/login"  # sets the host's session cookie, then shows PAGE
Colour = tuple[int, int, int]
Blocks = tuple[Colour, Colour, Colour]  # clicked, typed, logged in


def pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == SCREEN
        return image.convert("RGB").getpixel((x, y))  # type: ignore[return-value]


class Page:
    """Where the page's blocks are on the screen: below the browser's own bars, which take the top ~90 px."""

    clicked = (SCREEN[0] // 4, 300)
    typed = (SCREEN[0] * 3 // 4, 300)
    session = (SCREEN[0] // 2, 446)
    button = (SCREEN[0] // 4, 680)
    input = (SCREEN[0] * 3 // 4, 680)


def blocks(sbx: Sandbox) -> Blocks:
    png = sbx.screenshot()
    return pixel(png, *Page.clicked), pixel(png, *Page.typed), pixel(png, *Page.session)


def wait_for(sbx: Sandbox, wanted: Blocks, timeout: float = 120) -> None:
    """Until the screen shows ``wanted`` (a page loads, a click paints, at the browser's pace)."""
    deadline = time.monotonic() + timeout
    while (seen := blocks(sbx)) != wanted:
        if time.monotonic() > deadline:
            raise AssertionError(f"the screen shows {seen}, not {wanted}")
        time.sleep(0.5)


@pytest.fixture
def desktop(net_client: Client) -> Iterator[Sandbox]:
    sbx = Sandbox.create(client=net_client, image="desktop", screen=f"{SCREEN[0]}x{SCREEN[1]}", memory_mb=2048,
                         network=True)  # fmt: skip
    yield sbx
    sbx.terminate()


def test_a_logged_in_page_is_clicked_typed_into_and_survives_suspend_and_two_forks(
    desktop: Sandbox, net_client: Client
) -> None:
    desktop.start_desktop()
    png = desktop.screenshot()
    assert png.startswith(b"\x89PNG") and Image.open(io.BytesIO(png)).size == SCREEN

    desktop.open(PAGE)
    wait_for(desktop, (BLUE, BLUE, GREY))  # no cookie yet: the host says so
    desktop.open(LOGIN)
    wait_for(desktop, (BLUE, BLUE, GREEN))
    desktop.mouse.click(*Page.button)
    wait_for(desktop, (RED, BLUE, GREEN))
    desktop.mouse.click(*Page.input)
    desktop.keyboard.type("hello")
    wait_for(desktop, (RED, GREEN, GREEN))

    desktop.suspend()
    desktop.resume()
    wait_for(desktop, (RED, GREEN, GREEN), timeout=60)  # the same page, its DOM and its storage: nothing reloaded

    checkpoint = desktop.checkpoint(type=CheckpointType.MEMORY)
    forks = [Sandbox.create(client=net_client, snapshot_id=checkpoint.id) for _ in range(2)]
    try:
        for fork in forks:
            wait_for(fork, (RED, GREEN, GREEN), timeout=60)
        forks[1].keyboard.press("BackSpace")  # "hell": that copy's input no longer says hello
        wait_for(forks[1], (RED, BLUE, GREEN))
        wait_for(forks[0], (RED, GREEN, GREEN), timeout=60)  # the other copy goes on as it was
        wait_for(desktop, (RED, GREEN, GREEN), timeout=60)
        forks[0].open(PAGE)  # loaded anew in a copy: still logged in (the cookie), still clicked (the storage)
        wait_for(forks[0], (RED, BLUE, GREEN))
    finally:
        for fork in forks:
            fork.terminate()
        net_client.request("DELETE", f"/v1/checkpoints/{checkpoint.id}")


@pytest.mark.fast
def test_actions_are_checked_and_become_argvs_never_a_shell_line() -> None:
    from stasis import InvalidRequest
    from stasis.daemon.rooms.desktop import commands
    from stasis.desktop.actions import DesktopAction
    from stasis.models import build

    typed = build(DesktopAction, action="type", text="$(rm -rf /); echo 'hi'")
    assert commands(typed) == [["xdotool", "type", "--delay", "12", "--", "$(rm -rf /); echo 'hi'"]]
    click = build(DesktopAction, action="click", x=10, y=20, button="right")
    assert commands(click) == [["xdotool", "mousemove", "10", "20", "click", "3"]]
    drag = build(DesktopAction, action="drag", x=1, y=2, to_x=3, to_y=4)
    assert commands(drag) == [["xdotool", "mousemove", "1", "2", "mousedown", "1",
                               "mousemove", "3", "4", "mouseup", "1"]]  # fmt: skip
    for fields, message in (
        ({"action": "click", "x": 5}, "both x and y"),
        ({"action": "press", "keys": ["ctrl+l; reboot"]}, "invalid key"),
        ({"action": "open", "url": "javascript:alert(1)"}, "url must be"),
        ({"action": "type"}, "a type needs text"),
        ({"action": "drag", "x": 1, "y": 1}, "a drag needs to_x"),
    ):
        with pytest.raises(InvalidRequest, match=message):
            build(DesktopAction, **fields)


def test_a_logged_in_page_survives_idle_suspend_a_daemon_sigkill_and_a_move(s3: S3, hosts: dict[str, TestHost]) -> None:
    """On node A the page is logged in (the test host's cookie), clicked (localStorage) and typed into (a form);
    it sleeps when idle and wakes at a screenshot; A's daemon is SIGKILLed; the sandbox moves through the remote
    store to node B. Each time the screen shows the page as it was; at the end the page loaded anew on B shows
    that the cookie and the storage came along too (the test host answers the cookie; the page reads the storage)."""
    nodes = {node: Daemon(new_home(f"desktop-{node}")) for node in ("node-a", "node-b")}
    for node, daemon in nodes.items():
        daemon.sticky_env.update(s3.env, STASIS_NODE=node, STASIS_DNS_UPSTREAM=hosts["web"].address)
        daemon.start()
    a, b = nodes["node-a"], nodes["node-b"]
    try:
        with a.client() as client:
            sbx = Sandbox.create("desk-mover", client=client, image="desktop", screen=f"{SCREEN[0]}x{SCREEN[1]}",
                                 memory_mb=2048, network=True, timeout_secs=5, on_idle="suspend")  # fmt: skip
            sbx.open(LOGIN)
            wait_for(sbx, (BLUE, BLUE, GREEN))
            sbx.mouse.click(*Page.button)
            sbx.mouse.click(*Page.input)
            sbx.keyboard.type("hello")
            wait_for(sbx, (RED, GREEN, GREEN))
            wait_until(lambda: sbx.info().status.value == "suspended", timeout=120)  # idle: it sleeps by itself
            wait_for(sbx, (RED, GREEN, GREEN), timeout=60)  # a screenshot wakes it, as it was
        a.kill()
        a.start()
        with a.client() as client:
            sbx = Sandbox.connect(sbx.id, client=client)
            wait_for(sbx, (RED, GREEN, GREEN), timeout=60)
            sbx.push()
        with b.client() as client:
            Sandbox.pull(sbx.id, client=client)
            moved = Sandbox.connect(sbx.id, client=client)
            wait_for(moved, (RED, GREEN, GREEN), timeout=60)
            moved.open(PAGE)  # loaded anew (its input empty): the host is asked again, with the cookie the browser kept
            wait_for(moved, (RED, BLUE, GREEN))
            moved.terminate()
    finally:
        for daemon in nodes.values():
            terminate_all(daemon)
            daemon.stop()


TOGGLE = """<!doctype html><html><body style="margin:0;height:100vh;background:#0000ff"><script>
let red = false;
document.body.onclick = () => { red = !red; document.body.style.background = red ? "#ff0000" : "#0000ff"; };
</script></body></html>"""  # each click toggles the page between blue and red


@pytest.mark.timeout(900)  # Chromium on TCG under a loaded CI: 111-145 s alone, over the suite's 300 s once
def test_the_desktop_works_and_sleeps_in_a_microvm_too(client: Client) -> None:
    """The same image and session in a QEMU microVM (TCG here: Chromium takes its time, nothing else differs):
    a page of the sandbox's own opened, clicked, and as it was after a suspend and resume."""
    sbx = Sandbox.create(client=client, image="desktop", backend="microvm", screen="800x600", memory_mb=2048)
    try:
        sbx.write_file("/root/toggle.html", TOGGLE)
        sbx.open("file:///root/toggle.html")
        spot = (200, 450)  # in the page, off the pointer's way
        wait_until(lambda: pixel_at(sbx, spot, (800, 600)) == BLUE, timeout=600, interval=1)
        sbx.mouse.click(400, 450)
        wait_until(lambda: pixel_at(sbx, spot, (800, 600)) == RED, timeout=180, interval=1)
        sbx.suspend()
        sbx.resume()
        assert pixel_at(sbx, spot, (800, 600)) == RED  # the page as it was: the guest's memory came back
    finally:
        sbx.terminate()


def pixel_at(sbx: Sandbox, spot: tuple[int, int], size: tuple[int, int]) -> Colour:
    with Image.open(io.BytesIO(sbx.screenshot())) as image:
        assert image.size == size
        return image.convert("RGB").getpixel(spot)  # type: ignore[return-value]
