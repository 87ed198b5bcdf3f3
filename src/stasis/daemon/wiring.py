"""The daemon's rooms, wired together in one place: the lifecycle core, and what stands on it.

    faces       routes/ (HTTP), console/, mcp_http, e2b/    translate a protocol onto the rooms below
    code        CodeRoom: run_code, relayed to the kernel server in the sandbox (E2B's SDKs reach it directly)
    desktop     DesktopRoom: a desktop session's screen, mouse, keyboard and browser
    front       Front: create and resume get their source   pools, templates, the remote store
    features    Checkpoints, forks, PoolManager, Ports, RemoteService, GuestOperations, ssh, idle reaper,
                SecretsRoom (the secret store, its CAs, the broker the egress proxy asks)
    core        SandboxService: locks, store transitions, channels, backends, one teardown

Each room is handed only what it uses; none reaches back into a room above it. A face gets the rooms
through :data:`.faces.deps.RoomsDep` (FastAPI's dependency), never through a module-level global.
"""

from __future__ import annotations

from ..paths import Paths
from ..remote.config import RemoteConfig
from .core.service import SandboxService
from .faces.deps import Rooms
from .faces.e2b.keys import E2bKeys
from .faces.e2b.listener import E2bListeners
from .faces.e2b.room import E2bRoom
from .rooms.audit import AuditLog
from .rooms.checkpointing import Checkpoints
from .rooms.code import CodeRoom
from .rooms.desktop import DesktopRoom
from .rooms.front import Front
from .rooms.idle import IdleReaper
from .rooms.meter import Meter
from .rooms.operations import GuestOperations
from .rooms.pools import PoolManager
from .rooms.ports import Ports
from .rooms.remote import RemoteService
from .rooms.secrets import SecretsRoom
from .rooms.ssh import HostKeys
from .rooms.teams import TeamsRoom
from .rooms.volume_remote import VolumeTransfers
from .rooms.volumes import VolumesRoom
from .rooms.webhooks import WebhooksRoom


def build(paths: Paths, core: SandboxService, token: str | None = None) -> Rooms:
    """Every room, each handed only what it uses; the hooks between them set here and nowhere else."""
    tables = core.tables  # each table to its one writer
    checkpoints = Checkpoints(core, tables.checkpoints)
    remote_config = RemoteConfig.from_env()
    remote = RemoteService(core, remote_config, checkpoints, tables.pushes) if remote_config else None
    pools = PoolManager(core, tables.pools, checkpoints)
    ports = Ports(core, tables.ports)
    secrets, volumes, teams = SecretsRoom(core), VolumesRoom(core), TeamsRoom(core, tables.teams)
    core.use_quotas(teams.admit, teams.longest_lifetime)
    checkpoints.admit = teams.admit_checkpoint
    teams.volume_limits, volumes.admit = volumes.limits, teams.admit_volume
    teams.holdings = lambda team: [f"checkpoint {c.id}" for c in checkpoints.list() if c.spec.team == team] + [
        f"volume {v.name}" for v in volumes.store.list() if v.team == team] + [
        f"webhook {h.id}" for h in rooms.webhooks.list() if h.team == team] + [
        f"secret {s.name}" for s in secrets.list(team)]  # fmt: skip
    if remote is not None:
        remote.volumes = VolumeTransfers(remote, volumes)
    checkpoints.keep_volumes, checkpoints.drop_volumes = volumes.keep, volumes.drop
    front, ops = Front(core, checkpoints, pools, remote, secrets.check, volumes.check), GuestOperations(core)
    front.fork_volumes, front.discard_volumes = volumes.fork_for, volumes.discard
    idle_to_store = remote.push_sandbox if remote is not None and remote.config.idle_to_store else None
    e2b = E2bRoom(core, front, checkpoints, E2bKeys(paths.home, token), secrets, volumes)
    rooms = Rooms(
        paths=paths, core=core, front=front, checkpoints=checkpoints, pools=pools, ports=ports, remote=remote,
        ops=ops, host_keys=HostKeys(paths.home / "ssh-host-keys"), reaper=IdleReaper(core, checkpoints, idle_to_store),
        e2b=e2b, e2b_listeners=E2bListeners(e2b, core, ops, ports), code=CodeRoom(core, ports, ops),
        desktop=DesktopRoom(core, ports, ops), secrets=secrets, volumes=volumes, teams=teams,
        webhooks=WebhooksRoom(core, tables.webhooks), audit=AuditLog(paths.home / "audit.db"), token=token,
        meter=Meter(paths.home / "meter.db", core),
    )  # fmt: skip
    e2b.code_interpreter = rooms.code.ensure
    e2b.teams, e2b.audit, e2b.webhooks = teams, rooms.audit, rooms.webhooks
    rooms.webhooks.describe = e2b.describe
    # what the core calls back: when a sandbox starts here, and when it ends (what a room holds of it goes too)
    core.use_secrets(secrets.broker)
    core.on_ready(secrets.install_trust)
    core.on_ready(rooms.desktop.on_start)
    core.on_stopping(rooms.meter.stopping)
    for forget in (ports.forget, secrets.forget, rooms.code.server.forget, rooms.desktop.session.forget,
                   rooms.desktop.forget, e2b.forget):  # fmt: skip
        core.on_teardown(forget)
    # settled after a restart before the sandboxes are: cut-off checkpoints, cut-off pushes
    rooms.settling = [checkpoints.recover, *([remote.settle] if remote is not None else [])]
    if token:
        rooms.logins.tokens.add(token)
        rooms.logins.keyed_by(token)
    return rooms
