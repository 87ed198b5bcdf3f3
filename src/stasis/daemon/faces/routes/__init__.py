"""The HTTP face: one router per resource, each a thin translation onto the rooms (see ``..rooms``)."""

from __future__ import annotations

from . import (
    accounting,
    checkpoints,
    code,
    commands,
    desktop,
    e2b,
    egress,
    files,
    images,
    pools,
    ports,
    remote,
    sandboxes,
    secrets,
    system,
    teams,
    terminals,
    volumes,
    webhooks,
)

FACES = (
    system, images, sandboxes, pools, checkpoints, remote, secrets,
    commands, code, desktop, egress, terminals, ports, files, e2b, volumes, teams, webhooks, accounting,
)  # fmt: skip
ROUTERS = [face.router for face in FACES]
