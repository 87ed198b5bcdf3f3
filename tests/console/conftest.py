"""What the console's browser tests share: a daemon on TCP with a token, Debian's chromium driven by Playwright,
a logged-in page, screenshots into build/test-artifacts/console/ (or $STASIS_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.conftest import Daemon, new_home, terminate_all

TOKEN = "console-test-token"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("STASIS_TEST_ARTIFACTS") or Path(__file__).parents[2] / "build" / "test-artifacts")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def console_daemon() -> Iterator[Daemon]:
    d = Daemon(new_home("console"))
    d.tcp = f"127.0.0.1:{free_port()}"  # type: ignore[attr-defined]
    d.sticky_env["STASIS_TOKEN"] = TOKEN
    d.start("--tcp", d.tcp)  # type: ignore[attr-defined]
    yield d
    terminate_all(d)
    d.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: `make setup` installs it (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def base(console_daemon: Daemon) -> str:
    return f"http://{console_daemon.tcp}"  # type: ignore[attr-defined]


@pytest.fixture
def page(browser: Browser, base: str, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(base_url=base)
    p = context.new_page()
    p.on("dialog", lambda dialog: dialog.accept())  # the console confirms every action
    yield p
    shoot(p, request.node.name + "-end")
    context.close()


def shoot(page: Page, name: str) -> None:
    (ARTIFACTS / "console").mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console" / f"{name}.png"), full_page=True)


def log_in(page: Page) -> None:
    page.goto("/ui/")
    expect(page).to_have_url(re.compile(r".*/ui/login$"))
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Sandboxes")
