"""The OCI bundle (config.json) of a gVisor sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...images import runtime
from ...models import SandboxSpec
from .agentdir import MOUNT_POINT
from .changes import IMAGE_MOUNT

AGENT_PATH = f"{MOUNT_POINT}/boot.py"
LEGACY_AGENT_PATH = f"{MOUNT_POINT}/agent.py"  # sandboxes made before the mount: the agent sits in their files
CPU_PERIOD = 100_000
NOFILE = 8192  # open files per process inside a sandbox

# Docker's default set: root in the sandbox can install packages and chown files;
# the isolation boundary is gVisor's kernel, not a missing capability.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]  # fmt: skip


def oci_config(
    sandbox_id: str,
    hostname: str,
    spec: SandboxSpec,
    rootfs: str,
    agent: Path | None,
    tmp: Path | None,
    netns: Path | None = None,
    resolv_conf: Path | None = None,
    python: str = "/usr/bin/python3",
    python_runtime: Path | None = None,
    image: Path | None = None,
    volumes: list[tuple[str, Path, bool]] | None = None,
) -> dict[str, Any]:
    """The bundle's config; ``agent`` is the host directory mounted read-only at /opt/stasis
    (None only for sandboxes made before that, whose agent sits in their own files); ``tmp`` is
    the directory on its disk mounted at /tmp (None: gVisor's own tmpfs, charged to its memory);
    ``netns`` the network namespace whose device runsc takes (None: no network), with
    ``resolv_conf`` mounted at /etc/resolv.conf (the daemon's resolver at the gateway); ``python``
    the image's interpreter, which runs the agent, or (``python_runtime``, an image without one)
    stasis's own, mounted read-only at /opt/stasis-python; ``image`` the image's files, mounted read-only at
    /opt/stasis-image for a sandbox with fast storage (its agent packs a FILESYSTEM checkpoint against them);
    ``volumes`` (path in the sandbox, host directory, read only) the volumes it mounts."""
    interpreter = [python] if python_runtime is None else runtime.argv_prefix()
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": [*interpreter, "-I", "-S", "-u", AGENT_PATH if agent else LEGACY_AGENT_PATH],  # -S: 30 ms sooner
            "env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/root",
                "LANG=C.UTF-8",
                "STASIS_SUDO_BROKER=1",  # setuid does not work under gVisor: the agent is the images' sudo
            ],
            "cwd": "/",
            "capabilities": {key: CAPABILITIES for key in ("bounding", "effective", "permitted")},
            # Each open file in the sandbox costs its kernel (the sentry) host descriptors: bounded, one
            # process cannot wedge the sandbox's checkpoint (which hangs when the sentry runs out).
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": NOFILE, "soft": NOFILE}],
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        ],
        "linux": {
            "namespaces": [
                {"type": t, **({"path": str(netns)} if t == "network" and netns else {})}
                for t in ("pid", "network", "ipc", "uts", "mount")
            ],
            "cgroupsPath": f"/stasis/{sandbox_id}",
            "resources": {
                "memory": {"limit": spec.memory_mb << 20},
                "cpu": {"quota": int(spec.cpus * CPU_PERIOD), "period": CPU_PERIOD},
                "pids": {"limit": 32768},
            },
        },
    }
    config["mounts"] += _binds(agent, tmp, python_runtime, image, netns, resolv_conf, volumes)  # type: ignore[operator]
    return config


VOLUME_OPTIONS = ("rbind", "nosuid", "nodev")  # what a sandbox leaves in a shared volume gains no privilege


def _binds(
    agent: Path | None, tmp: Path | None, python_runtime: Path | None, image: Path | None, netns: Path | None,
    resolv_conf: Path | None, volumes: list[tuple[str, Path, bool]] | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The host directories bound into the sandbox (see :func:`oci_config`)."""
    binds: list[tuple[str, Path | None, list[str]]] = [
        (MOUNT_POINT, agent, ["rbind", "ro"]),
        ("/tmp", tmp, ["rbind", "rw"]),
        (runtime.MOUNT_POINT, python_runtime, ["rbind", "ro"]),
        (IMAGE_MOUNT, image, ["rbind", "ro"]),
        ("/etc/resolv.conf", resolv_conf if netns is not None else None, ["ro"]),
        *((path, source, [*VOLUME_OPTIONS, "ro" if read_only else "rw"]) for path, source, read_only in volumes or []),
    ]
    return [{"destination": d, "type": "bind", "source": str(s), "options": o} for d, s, o in binds if s is not None]
