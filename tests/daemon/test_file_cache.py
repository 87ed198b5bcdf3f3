"""A sandbox whose kernel runs out of host descriptors: gVisor's sentry holds one or two of them for
every file open in the sandbox and every dentry it caches, within the limit it inherits from the
daemon. The sandbox's processes get EMFILE, and removing the sandbox still works and leaves nothing
behind, even when `runsc delete` hangs on it (it did: the sandbox is then killed by pid)."""

from __future__ import annotations

from stasis import Sandbox
from tests.conftest import Daemon, sandbox_processes_under

HOLD = r"""
held = []
try:
    for n in range(4000):
        held.append(open(f"/root/f{n}", "w"))
except OSError as exc:
    print(exc.errno, len(held))
"""


def test_a_sandbox_out_of_host_descriptors_is_still_removed_cleanly(own_daemon: Daemon) -> None:
    own_daemon.start(open_files=1024)  # the sentry inherits it: 4000 open files cannot fit
    with own_daemon.client() as client:
        sbx = Sandbox.create(client=client, backend="gvisor", memory_mb=512)
        sbx.write_file("/root/hold.py", HOLD)
        result = sbx.run(["python3", "/root/hold.py"], timeout=120)
        errno, opened = result.stdout.split()
        assert errno == "24" and 0 < int(opened) < 4000  # EMFILE inside, the sandbox lives on
        sbx.terminate()
    assert sandbox_processes_under(own_daemon.paths.home) == []
    assert list(own_daemon.paths.sandboxes.iterdir()) == []
    assert not any(own_daemon.paths.runsc_root.iterdir())
