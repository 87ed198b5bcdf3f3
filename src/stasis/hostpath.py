"""The one door from an untrusted string to a host path.

Names, keys and ids reach stasis from clients, image metadata (``image.json``), remote-store
manifests and sandboxes' own files. None of them may name a place outside the directory it is
meant for, so each becomes a path only here: one component, matched against the pattern of what
it is (an image key, a checkpoint id, a sha256), never ``..`` and never hidden (staging
directories are). ``tests/daemon/test_hostpath.py`` lists every caller and tries each with
traversal strings.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import InvalidRequest

COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
IMAGE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
SANDBOX_ID = re.compile(r"sb-[0-9a-z]{12}")
CHECKPOINT_ID = re.compile(r"ck-[0-9a-z]{12}")
SHA256 = re.compile(r"[0-9a-f]{64}")
HEX_KEY = re.compile(r"[0-9a-f]{8,64}")


def child(base: Path, name: object, what: str, pattern: re.Pattern[str] = COMPONENT) -> Path:
    """``base / name`` if ``name`` is one safe component of the form ``pattern``; else InvalidRequest
    naming ``what`` it was meant to be (echoing at most 80 characters of it)."""
    if not isinstance(name, str) or not pattern.fullmatch(name) or ".." in name:
        shown = repr(name)[:80]
        raise InvalidRequest(f"invalid {what} {shown}: it must be one name of the form {pattern.pattern}")
    return base / name


def is_plain_dir(path: Path) -> bool:
    """A real directory, not a symlink to one (a link planted in stasis's own tree is never followed)."""
    return path.is_dir() and not path.is_symlink()
