"""A desktop sandbox (image `desktop`, Chromium on Xvfb) as a computer-use agent drives it.

    .venv/bin/python benchmarks/desktop.py [--rounds N] [--backend gvisor]

- screenshot round trip: `sbx.screenshot()` (scrot in the sandbox, the PNG over the API) beside the bare
  `scrot` run by `sbx.run` (the same command, its bytes discarded: what the desktop's room adds is the rest);
- click → next screenshot: `mouse.click` then `screenshot()`, an agent's step;
- create → first screenshot: `Sandbox.create(image="desktop")` until its first screenshot (Xvfb, openbox,
  x11vnc and Chromium started at boot);
- resume → first screenshot, after a suspend with Chromium open;
- host memory (PSS of its host processes) of the idle desktop, and of the suspended one (nothing runs).

Prints medians; writes benchmarks/results/desktop-BACKEND.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import Comparison, report_ratios, serving_daemon, timed, write_results

from stasis import Client, Sandbox
from stasis.daemon.rooms.host_usage import host_usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--lifecycles", type=int, default=3, help="creates and resumes measured")
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    rows: dict[str, Comparison] = {}
    extra: dict[str, float] = {}
    with serving_daemon("stasis-bench-desktop-") as paths, Client(paths) as client:

        def create_to_screenshot() -> Sandbox:
            sbx = Sandbox.create(client=client, backend=args.backend, image="desktop", memory_mb=2048)
            sbx.screenshot()
            return sbx

        creates, made = [], []
        for _ in range(args.lifecycles):
            started = time.perf_counter()
            made.append(create_to_screenshot())
            creates.append(time.perf_counter() - started)
        for sbx in made[1:]:
            sbx.terminate()
        sbx = made[0]
        try:
            scrot = ["sh", "-c", "DISPLAY=:0 scrot --overwrite /tmp/bench.png"]
            shots = timed(sbx.screenshot, args.rounds)
            rows["screenshot round trip"] = (shots, timed(lambda: sbx.run(scrot), args.rounds), "scrot via run")
            clicks = timed(lambda: (sbx.mouse.click(100, 100), sbx.screenshot()), args.rounds)
            rows["click → next screenshot"] = (clicks, shots, "a screenshot alone")
            time.sleep(5)
            extra["idle_host_mib"] = host_usage(sbx.id)[1]
            resumes = []
            for _ in range(args.lifecycles):
                sbx.suspend()
                extra["suspended_host_mib"] = host_usage(sbx.id)[1]
                started = time.perf_counter()
                sbx.resume()
                sbx.screenshot()
                resumes.append(time.perf_counter() - started)
            rows["create → first screenshot"] = (creates, shots, "a screenshot alone")
            rows["resume → first screenshot"] = (resumes, shots, "a screenshot alone")
        finally:
            sbx.terminate()
    name = f"desktop-{args.backend}"
    report = report_ratios(f"a desktop sandbox ({args.backend})", name, rows, {"backend": args.backend, **extra})
    print(f"host memory: {extra['idle_host_mib']:.0f} MiB idle, {extra['suspended_host_mib']:.0f} MiB suspended")
    print(f"create → first screenshot: {statistics.median(creates):.1f} s")
    write_results(name, report)


if __name__ == "__main__":
    main()
