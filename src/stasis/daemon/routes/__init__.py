"""The HTTP face: one router per resource, each a thin translation onto the rooms (see ``..rooms``)."""

from __future__ import annotations

from . import checkpoints, code, commands, e2b, files, images, pools, ports, remote, sandboxes, system, terminals

ROUTERS = [
    m.router
    for m in (system, images, sandboxes, pools, checkpoints, remote, commands, code, terminals, ports, files, e2b)
]
