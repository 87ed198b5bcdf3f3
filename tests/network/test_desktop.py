"""A desktop sandbox (image `desktop`): a page of a test host in its Chromium, read back by screenshots.

The page (tests/network/testhost_server.py, /desktop) paints its state as colour blocks: top left blue, red
once its button was clicked (kept in localStorage); top right blue, green while its input holds "hello". So
every check is a screenshot's pixels: what an agent sees is what the test sees.
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

SCREEN = (1024, 768)
BLUE, RED, GREEN = (0, 0, 255), (255, 0, 0), (0, 255, 0)
PAGE = "http://allowed.test/desktop"  # the web test host, by the test DNS zone


def pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == SCREEN
        return image.convert("RGB").getpixel((x, y))  # type: ignore[return-value]


class Page:
    """Where the page's blocks are on the screen: below the browser's own bars, which take the top ~90 px."""

    clicked = (SCREEN[0] // 4, 300)
    typed = (SCREEN[0] * 3 // 4, 300)
    button = (SCREEN[0] // 4, 680)
    input = (SCREEN[0] * 3 // 4, 680)


def blocks(sbx: Sandbox) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    png = sbx.screenshot()
    return pixel(png, *Page.clicked), pixel(png, *Page.typed)


def wait_for(sbx: Sandbox, wanted: tuple[tuple[int, int, int], tuple[int, int, int]], timeout: float = 120) -> None:
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


def test_a_page_is_seen_clicked_and_typed_into_and_survives_suspend_and_two_forks(
    desktop: Sandbox, net_client: Client
) -> None:
    desktop.start_desktop()
    png = desktop.screenshot()
    assert png.startswith(b"\x89PNG") and Image.open(io.BytesIO(png)).size == SCREEN

    desktop.open(PAGE)
    wait_for(desktop, (BLUE, BLUE))
    desktop.mouse.click(*Page.button)
    wait_for(desktop, (RED, BLUE))
    desktop.mouse.click(*Page.input)
    desktop.keyboard.type("hello")
    wait_for(desktop, (RED, GREEN))

    desktop.suspend()
    desktop.resume()
    wait_for(desktop, (RED, GREEN), timeout=60)  # the same page, its DOM and its storage: nothing reloaded

    checkpoint = desktop.checkpoint(type=CheckpointType.MEMORY)
    forks = [Sandbox.create(client=net_client, snapshot_id=checkpoint.id) for _ in range(2)]
    try:
        for fork in forks:
            wait_for(fork, (RED, GREEN), timeout=60)
        forks[1].keyboard.press("BackSpace")  # "hell": that copy's input no longer says hello
        wait_for(forks[1], (RED, BLUE))
        wait_for(forks[0], (RED, GREEN), timeout=60)  # the other copy goes on as it was
        wait_for(desktop, (RED, GREEN), timeout=60)
    finally:
        for fork in forks:
            fork.terminate()
        net_client.request("DELETE", f"/v1/checkpoints/{checkpoint.id}")


@pytest.mark.fast
def test_actions_are_checked_and_become_argvs_never_a_shell_line() -> None:
    from stasis import InvalidRequest
    from stasis.daemon.desktop import commands
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


def test_the_page_survives_an_idle_suspend_its_auto_resume_and_a_daemon_sigkill(hosts: dict[str, TestHost]) -> None:
    daemon = Daemon(new_home("desktop-kill"))
    daemon.sticky_env["STASIS_DNS_UPSTREAM"] = hosts["web"].address
    daemon.start()
    try:
        with daemon.client() as client:
            sbx = Sandbox.create(client=client, image="desktop", screen=f"{SCREEN[0]}x{SCREEN[1]}", memory_mb=2048,
                                 network=True, timeout_secs=5, on_idle="suspend")  # fmt: skip
            sbx.open(PAGE)
            wait_for(sbx, (BLUE, BLUE))
            sbx.mouse.click(*Page.button)
            sbx.mouse.click(*Page.input)
            sbx.keyboard.type("hello")
            wait_for(sbx, (RED, GREEN))
            wait_until(lambda: sbx.info().status.value == "suspended", timeout=120)  # idle: it sleeps by itself
            wait_for(sbx, (RED, GREEN), timeout=60)  # a screenshot wakes it, as it was
        daemon.kill()
        daemon.start()
        with daemon.client() as client:
            wait_for(Sandbox.connect(sbx.id, client=client), (RED, GREEN), timeout=60)
    finally:
        terminate_all(daemon)
        daemon.stop()
