"""The web console in a real browser: Debian's chromium driven by Playwright, against a real daemon on
TCP with a token. Screenshots go to build/test-artifacts/console/ (or $STASIS_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from stasis import Sandbox
from stasis.agent import AgentRunner, Journal, OpenAIModel
from stasis.agent.scripted import ScriptedModel, call, final, serve_scripted, tools
from tests.conftest import Daemon
from tests.console.conftest import TOKEN, log_in, shoot

SCREEN = """(() => {
    const buffer = window.stasisTerminal.buffer.active, lines = [];
    for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i).translateToString(true));
    return lines;
})()"""  # the terminal's text, line by line


def echo_in_terminal(page: Page, word: str) -> None:
    """Open the sandbox page's terminal, type ``echo WORD`` and see WORD on its screen."""
    page.click("#open-terminal")
    page.wait_for_function("window.stasisTerminal !== undefined")
    page.locator("#terminal").click()
    page.wait_for_timeout(1500)  # the shell's prompt
    page.keyboard.type(f"echo {word}\n")
    page.wait_for_function(f"{SCREEN}.some(line => line.trim() === '{word}')", timeout=60_000)


def test_a_wrong_or_missing_token_shows_the_login_page_and_never_data(
    page: Page, base: str, console_daemon: Daemon
) -> None:
    with console_daemon.client() as client:
        secret = Sandbox.create("secret-box", memory_mb=256, client=client)
    page.goto("/ui/")
    expect(page.locator("#token")).to_be_visible()
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("neither this daemon's token")
    assert "secret-box" not in page.content()
    shoot(page, "wrong-token")
    for path in ("/ui/sandboxes/secret-box", "/ui/checkpoints", "/ui/runs"):
        page.goto(path)
        expect(page.locator("#token")).to_be_visible()
        assert "secret-box" not in page.content()
    with httpx.Client(base_url=base) as http:  # no session: no data, no action
        assert http.get("/ui/events").status_code == 401
        assert http.post(f"/ui/sandboxes/{secret.id}/remove").status_code == 401
        logged_in = http.post("/ui/login", data={"token": TOKEN})  # a session, but no CSRF header
        assert logged_in.status_code == 303
        assert http.post(f"/ui/sandboxes/{secret.id}/remove").status_code == 401
        assert "stasis_console" in http.cookies and TOKEN not in logged_in.headers.get("location", "")
    with pytest.raises(InvalidStatus, match="403"):  # closed before it is accepted
        connect(f"ws://{base.removeprefix('http://')}/ui/sandboxes/{secret.id}/pty").close()
    with console_daemon.client() as client:
        assert Sandbox.connect("secret-box", client=client).info().status.value == "running"
        Sandbox.connect("secret-box", client=client).terminate()


def test_a_sandbox_appears_live_and_suspends_from_the_console(page: Page, console_daemon: Daemon) -> None:
    log_in(page)
    with console_daemon.client() as client:
        sbx = Sandbox.create("live-box", memory_mb=256, client=client)
        row = page.locator("#sandboxes tr", has_text="live-box")
        expect(row).to_be_visible(timeout=15_000)  # pushed by the feed: the page was not reloaded
        expect(row.locator(".status")).to_have_text("running")
        shoot(page, "sandbox-listed")
        page.evaluate("window.notReloaded = true")
        row.locator("button[data-action=suspend]").click()
        expect(row.locator(".status")).to_have_text("suspended", timeout=30_000)
        assert page.evaluate("window.notReloaded") is True
        assert sbx.info().status.value == "suspended"
        shoot(page, "sandbox-suspended")
        sbx.terminate()
        expect(page.locator("#sandboxes tr", has_text="live-box")).to_have_count(0, timeout=15_000)


def test_the_terminal_runs_echo_hi(page: Page, console_daemon: Daemon) -> None:
    with console_daemon.client() as client:
        sbx = Sandbox.create("term-box", memory_mb=256, client=client)
    log_in(page)
    page.goto(f"/ui/sandboxes/{sbx.id}")
    echo_in_terminal(page, "hi")
    shoot(page, "terminal")
    with console_daemon.client() as client:
        Sandbox.connect(sbx.id, client=client).terminate()


def test_an_agent_run_shows_its_steps_and_tool_calls(page: Page, console_daemon: Daemon) -> None:
    scripted = ScriptedModel()
    scripted.script = [
        tools(call("write_file", path="/root/hello.py", content="print('hi from the agent')\n")),
        tools(call("run", command="python3 /root/hello.py")),
        final("hello.py prints a greeting"),
    ]
    with console_daemon.client() as client, serve_scripted(scripted) as url:
        sbx = Sandbox.create("agent-box", memory_mb=256, client=client)
        journal = Journal(console_daemon.paths.agent_journal)
        model = OpenAIModel("scripted", base_url=url, api_key="test")
        record = AgentRunner(journal, model, client).start(sbx.id, "write and run hello.py")
        journal.close()
        assert record.status == "completed"
        log_in(page)
        page.click("a[href='/ui/runs']")
        page.click(f"a[href='/ui/runs/{record.id}']")
        calls = page.locator(".call")
        expect(calls).to_have_count(2)
        expect(calls.nth(0).locator(".tool")).to_have_text("write_file")
        expect(calls.nth(0).locator(".arguments")).to_contain_text("/root/hello.py")
        expect(calls.nth(1).locator(".tool")).to_have_text("run")
        expect(calls.nth(1).locator(".result")).to_contain_text("hi from the agent")
        expect(page.locator(".facts")).to_contain_text("hello.py prints a greeting")
        shoot(page, "agent-run")
        sbx.terminate()


def test_the_checkpoint_tree_shows_a_forks_parent(page: Page, console_daemon: Daemon) -> None:
    with console_daemon.client() as client:
        parent = Sandbox.create("tree-parent", memory_mb=256, client=client)
        checkpoint = parent.checkpoint("filesystem", name="tree-ckpt")
        (child,) = parent.copy(times=1)
        log_in(page)
        page.goto("/ui/checkpoints")
        parent_item = page.locator("li", has=page.locator(f".node[data-id='{parent.id}']")).first
        expect(parent_item.locator(f"ul .node[data-id='{child.id}']")).to_be_visible()
        expect(parent_item.locator(f"ul .node[data-id='{checkpoint.id}']")).to_contain_text("tree-ckpt")
        shoot(page, "checkpoint-tree")
        page.click(f"button[data-restore='{checkpoint.id}']")  # a new sandbox from that node
        expect(page).to_have_url(re.compile(r".*/ui/sandboxes/sb-[0-9a-z]{12}$"))
        restored = page.url.rsplit("/", 1)[1]
        assert Sandbox.connect(restored, client=client).info().from_checkpoint == checkpoint.id
        Sandbox.connect(restored, client=client).terminate()
        child.terminate()
        parent.terminate()
        Sandbox.delete_checkpoint(checkpoint.id, client=client)


def test_names_from_a_sandbox_are_shown_as_text(page: Page, console_daemon: Daemon) -> None:
    alerts: list[str] = []
    page.on("dialog", lambda dialog: alerts.append(dialog.message))
    with console_daemon.client() as client:
        sbx = Sandbox.create("escape-box", memory_mb=256, client=client)
        sbx.write_file("/root/<script>", b"<img src=x onerror=alert(1)>")
        log_in(page)
        page.goto(f"/ui/sandboxes/{sbx.id}?path=/root")
        entry = page.locator("a.entry", has_text="<script>")
        expect(entry).to_have_text("<script>")
        assert "&lt;script&gt;" in page.content()
        entry.click()
        expect(page.locator("pre.file")).to_have_text("<img src=x onerror=alert(1)>")
        page.wait_for_timeout(500)
        assert alerts == []
        shoot(page, "escaped")
        sbx.terminate()
    missing = page.goto("/ui/sandboxes/no-such-box")  # said in a page, not a server error
    assert missing is not None and missing.status == 404
    expect(page.locator("p.error")).to_contain_text("no-such-box")


def test_stasis_ui_serves_the_console_of_a_socket_only_daemon(browser: Browser, daemon: Daemon) -> None:
    env = {**os.environ, **daemon.env}
    ui = subprocess.Popen([sys.executable, "-m", "stasis", "ui", "--no-browser"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert ui.stdout is not None and ui.stderr is not None
        url = ui.stdout.readline().strip()
        token = re.search(r"token (\S+)", ui.stderr.readline()).group(1)  # type: ignore[union-attr]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/ui/", url)
        with httpx.Client() as http:  # the proxy passes the console and nothing else of the API
            assert http.get(url.removesuffix("/ui/") + "/v1/sandboxes").status_code == 404
            assert http.get(url).status_code == 303  # to the login page
        with daemon.client() as client:
            sbx = Sandbox.create("ui-box", memory_mb=256, client=client)
        context = browser.new_context()
        page = context.new_page()
        page.goto(url + "login#token=" + token)  # what `stasis ui` opens: it logs in, then drops the fragment
        expect(page.locator("#sandboxes tr", has_text="ui-box")).to_be_visible(timeout=15_000)
        assert token not in page.url
        page.click("text=ui-box")
        echo_in_terminal(page, "through-the-proxy")
        shoot(page, "stasis-ui")
        context.close()
        with daemon.client() as client:
            Sandbox.connect(sbx.id, client=client).terminate()
    finally:
        ui.terminate()
        ui.wait(timeout=30)


def test_files_are_browsed_uploaded_and_downloaded(page: Page, console_daemon: Daemon, tmp_path: Path) -> None:
    with console_daemon.client() as client:
        sbx = Sandbox.create("files-box", memory_mb=256, client=client)
        sbx.make_dir("/root/project")
        sbx.write_file("/root/project/notes.txt", b"first line\n")
        log_in(page)
        page.goto(f"/ui/sandboxes/{sbx.id}")
        page.click("a.entry:text-is('project')")
        expect(page.locator("h2", has_text="Files")).to_contain_text("/root/project")
        local = tmp_path / "upload.bin"
        local.write_bytes(bytes(range(256)))
        page.set_input_files("#upload input[type=file]", str(local))
        page.click("#upload button")
        expect(page.locator("a.entry:text-is('upload.bin')")).to_be_visible()
        assert sbx.read_file("/root/project/upload.bin") == bytes(range(256))
        with page.expect_download() as download:
            page.locator("tr", has_text="notes.txt").locator("a", has_text="download").click()
        assert Path(download.value.path()).read_bytes() == b"first line\n"
        shoot(page, "files")
        sbx.terminate()


APP = r"""
import http.server, json
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the page's later requests share its connection
    def do_GET(self):
        cookie = self.headers.get("Cookie", "")
        with open("/root/seen.log", "a") as log:
            log.write(f"{self.path} {cookie}\n")
        page = self.path.split("?")[0] == "/"
        body = open("/root/page.html", "rb").read() if page else json.dumps({"cookie": cookie}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if page else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
"""

ATTACK = """<!doctype html><title>attack</title><script>
window.results = {};
const consoleHost = "CONSOLE", victim = "VICTIM";
function tryTerminal(query) {
  return new Promise((done) => {
    const socket = new WebSocket(`ws://${consoleHost}/ui/sandboxes/${victim}/pty?cols=80&rows=24${query}`);
    socket.onopen = () => { socket.send(new TextEncoder().encode("touch /root/pwned\\n")); done("opened"); };
    socket.onclose = () => done("closed");
    setTimeout(() => done("no answer"), 10000);
  });
}
(async () => {
  for (let i = 0; i < 3; i++) {  // on the connection that brought this page, and after
    const seen = await (await fetch("/echo-" + i)).json();
    window.results["cookie" + i] = seen.cookie;
  }
  window.results.plain = await tryTerminal("");
  window.results.guessed = await tryTerminal("&csrf=guess");
  await fetch(`http://${consoleHost}/ui/sandboxes/${victim}/remove`, {method: "POST", mode: "no-cors",
                                                                      credentials: "include"}).catch(() => {});
  window.results.csrf = await fetch(`http://${consoleHost}/ui/sandboxes/${victim}/remove`, {method: "POST",
      credentials: "include", headers: {"x-stasis-csrf": "guess"}}).then((r) => r.status, () => "blocked");
  window.results.done = true;
})();
</script>"""


def test_a_page_from_a_sandbox_port_reaches_neither_the_console_nor_other_ports_tokens(
    page: Page, console_daemon: Daemon
) -> None:
    """Exposed ports share the console's host (127.0.0.1): the same site for cookies, another origin. A page
    served by a sandbox tries the console's terminal and actions with the user's session, and reads what
    cookies reach its own app. None of it works."""
    client = console_daemon.client()
    victim = Sandbox.create("victim-box", memory_mb=256, client=client)
    attacker = Sandbox.create("attacker-box", memory_mb=256, client=client)
    try:
        for sbx in (victim, attacker):
            sbx.write_file("/root/app.py", APP)
            page_html = ATTACK.replace("CONSOLE", console_daemon.tcp).replace("VICTIM", victim.id)  # type: ignore[attr-defined]
            sbx.write_file("/root/page.html", page_html)
            sbx.start_process(["python3", "/root/app.py"], name="app")
        victim_url, attacker_url = victim.expose_port(8000), attacker.expose_port(8000)
        log_in(page)  # the user's console session: a cookie for 127.0.0.1
        page.goto(victim_url.replace("/?", "/echo?"))  # and the victim port's token cookie
        page.goto(attacker_url)
        page.wait_for_function("window.results && window.results.done === true", timeout=60_000)
        results = page.evaluate("window.results")
        shoot(page, "attack-page")
        assert results["plain"] == "closed" and results["guessed"] == "closed", results
        assert results["csrf"] in ("blocked", 401), results
        for i in range(3):
            assert "stasis_" not in results[f"cookie{i}"], results
        assert "stasis_" not in attacker.read_file("/root/seen.log").decode()
        assert "stasis_" not in victim.read_file("/root/seen.log").decode()
        assert victim.info().status.value == "running"
        assert victim.run("test -e /root/pwned").exit_code == 1
        page.goto(f"/ui/sandboxes/{victim.id}")  # the console itself still opens its terminal
        echo_in_terminal(page, "from-the-console")
    finally:
        for sbx in (victim, attacker):
            sbx.terminate()
        client.close()


def test_run_code_results_appear_inline_as_they_come(page: Page, console_daemon: Daemon) -> None:
    """Text as text, a DataFrame's HTML in an inert frame (no scripts), a plot as an image."""
    with console_daemon.client() as client:
        sbx = Sandbox.create("code-box", image="code-interpreter", memory_mb=1024, client=client)
    try:
        log_in(page)
        page.goto(f"/ui/sandboxes/{sbx.id}")
        page.fill("#code textarea", "print('counted', 6 * 7)")
        page.click("#code button[type=submit]")
        expect(page.locator("#code-output pre.stdout")).to_have_text("counted 42\n", timeout=120_000)
        source = ("import pandas as pd, matplotlib.pyplot as plt\n"
                  "display(pd.DataFrame({'city': ['Oslo<script>alert(1)</script>']}))\nplt.plot([1, 2])")  # fmt: skip
        page.fill("#code textarea", source)
        page.click("#code button[type=submit]")
        expect(page.locator("#code-output img.result")).to_be_visible(timeout=120_000)
        frame = page.locator("#code-output iframe.result")
        expect(frame).to_have_attribute("sandbox", "")
        expect(frame.content_frame.locator("table")).to_contain_text("Oslo")
        assert page.locator("#code-output img.result").evaluate("img => img.naturalWidth") > 0
        shoot(page, "code-results")
    finally:
        with console_daemon.client() as client:
            Sandbox.connect(sbx.id, client=client).terminate()
