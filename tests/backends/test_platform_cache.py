"""runsc's platform, probed once per host and cached: a cache that names no platform stasis would choose, or that
another user wrote (the directory may be /tmp's), is ignored and the probe runs again. `false` stands in for runsc:
every probe fails, so a cache that was taken shows as a platform chosen without one."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from stasis.backends.gvisor import runsc
from stasis.errors import BackendError

pytestmark = pytest.mark.fast

BINARY = "/bin/false"


def cache(directory: Path, platform: str) -> Path:
    path = directory / "runsc-platform.json"
    path.write_text(json.dumps({"version": "v1", "binary": BINARY, "platform": platform, "reason": "cached"}))
    return path


def choose(directory: Path) -> tuple[str, str]:
    return asyncio.run(runsc.choose_platform(BINARY, "v1", directory))


def test_an_own_cache_of_a_known_platform_spares_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STASIS_RUNSC_PLATFORM", raising=False)
    cache(tmp_path, "ptrace")
    assert choose(tmp_path) == ("ptrace", "cached")


def test_a_cache_naming_another_platform_or_written_by_another_user_is_probed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STASIS_RUNSC_PLATFORM", raising=False)
    cache(tmp_path, "kvm --debug-log=/etc")  # never a platform stasis would choose
    with pytest.raises(BackendError, match="no runsc platform works"):
        choose(tmp_path)
    planted = cache(tmp_path, "ptrace")
    if os.geteuid() == 0:
        os.chown(planted, 65534, 65534)
        with pytest.raises(BackendError, match="no runsc platform works"):
            choose(tmp_path)
    linked = tmp_path / "elsewhere"
    linked.mkdir()
    cache(linked, "ptrace").rename(linked / "real.json")
    (linked / "runsc-platform.json").symlink_to(linked / "real.json")
    with pytest.raises(BackendError, match="no runsc platform works"):
        choose(linked)
