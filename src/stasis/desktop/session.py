"""The desktop session, run inside the sandbox: Xvfb, openbox, x11vnc and Chromium, kept running.

    python3 session.py 1280x800

Standard library only. Chromium keeps its profile in /root/.config/stasis-chromium (cookies, localStorage,
tabs); the sandbox itself is its sandbox (--no-sandbox: gVisor's kernel and the microVM are the isolation).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

DISPLAY = ":0"
PROFILE = "/root/.config/stasis-chromium"
CHROMIUM = [
    "chromium", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--no-default-browser-check", "--password-store=basic", "--disable-background-networking",
    "--disable-component-update", "--disable-breakpad",
    "--disable-features=Translate,MediaRouter",
    f"--user-data-dir={PROFILE}", "--window-position=0,0", "--start-maximized",
]  # fmt: skip


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for_display(timeout: float = 60.0) -> None:
    socket = f"/tmp/.X11-unix/X{DISPLAY[1:]}"
    deadline = time.monotonic() + timeout
    while not os.path.exists(socket):
        if time.monotonic() > deadline:
            sys.exit(f"Xvfb did not open {socket} within {timeout:.0f}s")
        time.sleep(0.05)


def main() -> None:
    width, height = sys.argv[1].split("x") if len(sys.argv) > 1 else ("1280", "800")
    # Chromium's shared memory and temporary files are made and unlinked at once, kept open: on the sandbox's
    # own tmpfs (/dev/shm) a suspend saves them; on a disk's directory (/tmp) gVisor cannot.
    os.makedirs("/dev/shm", exist_ok=True)
    env = {**os.environ, "DISPLAY": DISPLAY, "HOME": os.environ.get("HOME", "/root"), "TMPDIR": "/dev/shm"}
    os.makedirs(PROFILE, exist_ok=True)
    # Chromium maps its metrics file, then deletes it while mapped: kept on the sandbox's tmpfs, where a suspend
    # saves such a file (on the disk gVisor cannot). The profile itself stays on the disk: its cookies last.
    metrics = os.path.join(PROFILE, "BrowserMetrics")
    os.makedirs("/dev/shm/stasis-chromium-metrics", exist_ok=True)  # again after a cold boot: tmpfs starts empty
    if not os.path.islink(metrics):
        subprocess.run(["rm", "-rf", metrics], check=False)
        os.symlink("/dev/shm/stasis-chromium-metrics", metrics)
    xvfb = start(["Xvfb", DISPLAY, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", "-dpi", "96"], env)
    wait_for_display()
    start(["openbox"], env)
    for port, mode in ((5900, []), (5901, ["-viewonly"])):  # the one that takes input, the one that only shows
        start(["x11vnc", "-display", DISPLAY, "-rfbport", str(port), "-shared", "-forever", "-nopw", "-quiet",
               "-noxdamage", *mode], env)  # fmt: skip
    browser = start([*CHROMIUM, f"--window-size={width},{height}", "about:blank"], env)
    print(f"desktop {width}x{height} on {DISPLAY}", flush=True)
    while xvfb.poll() is None:
        if browser.poll() is not None:  # closed by the agent (or crashed): the next one opens the same profile
            browser = start([*CHROMIUM, f"--window-size={width},{height}"], env)
        time.sleep(1.0)
    sys.exit("Xvfb ended")


if __name__ == "__main__":
    main()
