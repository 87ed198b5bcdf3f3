"""Where the remote store is: ``STASIS_REMOTE=s3://bucket/prefix`` plus the standard AWS variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), which boto3
reads itself: MinIO, Ceph RGW, R2 and GCS's S3 API work through ``AWS_ENDPOINT_URL``. Or
``STASIS_REMOTE=file:///path``: a directory every node shares (one machine's fleet, NFS)."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from ..errors import InvalidRequest

BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
DEFAULT_CACHE_MB = 10240


@dataclass(frozen=True)
class RemoteConfig:
    bucket: str
    prefix: str  # "" or ending in "/"
    cache_limit_bytes: int
    directory: Path | None = None  # a shared directory instead of a bucket
    idle_to_store: bool = False  # STASIS_IDLE_TO_STORE=1 (a fleet's): idle suspends go on to the store

    @property
    def url(self) -> str:
        return f"file://{self.directory}" if self.directory else f"s3://{self.bucket}/{self.prefix}"

    @classmethod
    def from_env(cls) -> RemoteConfig | None:
        """None when no remote store is configured."""
        url = os.environ.get("STASIS_REMOTE", "").strip()
        if not url:
            return None
        config = cls._parse(url)
        return dataclasses.replace(config, idle_to_store=os.environ.get("STASIS_IDLE_TO_STORE") == "1")

    @classmethod
    def _parse(cls, url: str) -> RemoteConfig:
        parsed = urlparse(url)
        if parsed.scheme == "file":
            return cls._directory(url, parsed.netloc, parsed.path)
        if parsed.scheme != "s3" or not BUCKET.fullmatch(parsed.netloc or ""):
            raise InvalidRequest(
                f"STASIS_REMOTE={url!r} is not an S3 location; write it as s3://bucket/prefix "
                "(the endpoint goes in AWS_ENDPOINT_URL)"
            )
        prefix = parsed.path.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise InvalidRequest(f"STASIS_REMOTE={url!r}: the prefix may not have empty, '.' or '..' parts")
        try:
            cache_mb = int(os.environ.get("STASIS_REMOTE_CACHE_MB", DEFAULT_CACHE_MB))
        except ValueError:
            raise InvalidRequest("STASIS_REMOTE_CACHE_MB must be a whole number of MiB") from None
        return cls(parsed.netloc, prefix + "/" if prefix else "", max(cache_mb, 0) << 20)

    @classmethod
    def _directory(cls, url: str, host: str, path: str) -> RemoteConfig:
        if host or not path.startswith("/") or any(part in (".", "..") for part in path.split("/")):
            raise InvalidRequest(f"STASIS_REMOTE={url!r}: write a shared directory as file:///absolute/path")
        return cls("", "", 0, directory=Path(path))


def node_name(home: Path) -> str:
    """This daemon's name in the store's ownership records: ``STASIS_NODE``, else one made once per home."""
    configured = os.environ.get("STASIS_NODE")
    if configured:
        if not NODE.fullmatch(configured):
            raise InvalidRequest(f"STASIS_NODE={configured!r}: use letters, digits, '.', '_' and '-' (up to 63)")
        return configured
    path = home / "node"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        name = f"{socket.gethostname().split('.')[0][:40]}-{secrets.token_hex(3)}"
        path.write_text(name + "\n")
        return name
