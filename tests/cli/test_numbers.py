"""Numbers the CLI prints are true: disk use as `du` counts it, a cached build said to be cached, doctor's images."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import Daemon


def stasis(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stasis", *args], env=daemon.env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)  # fmt: skip


def test_df_counts_images_as_du_does(daemon: Daemon) -> None:
    """Build steps share their parent's files as hard links: each file counts once, as `du` counts it."""
    usage = json.loads(stasis(daemon, "df", "--json").stdout)
    du = subprocess.run(["du", "-s", "--block-size=1", str(daemon.paths.images)], capture_output=True, text=True)
    on_disk = int(du.stdout.split()[0])
    assert 0.8 * on_disk <= usage["images_bytes"] <= on_disk  # du adds directories' own blocks


def test_a_cached_recipe_build_says_it_is_cached(daemon: Daemon) -> None:
    built = stasis(daemon, "image", "build", "default")
    assert built.returncode == 0 and "cached (built" in built.stdout and "built in" not in built.stdout, built.stdout


def test_doctor_lists_images_not_build_step_caches(daemon: Daemon) -> None:
    report = json.loads(stasis(daemon, "doctor", "--json").stdout)
    assert report["images"] and not [key for key in report["images"] if key.startswith("build-")]
    assert isinstance(report["build_step_caches"], int)
