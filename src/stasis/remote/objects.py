"""The object store, through boto3: whole objects, and JSON documents written only if they are still
what the writer read (S3's conditional writes: If-None-Match for a new key, If-Match on the ETag)."""

from __future__ import annotations

import json
import logging
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ..errors import Conflict, NotFound, StoreUnreachable
from .config import RemoteConfig

log = logging.getLogger(__name__)

CONNECTIONS = 16  # parallel transfers share this pool
MISSING = {"404", "NoSuchKey", "NotFound"}
CHANGED = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


class ObjectStore:
    def __init__(self, config: RemoteConfig) -> None:
        self.config = config
        self.bucket = config.bucket
        self.client = boto3.session.Session().client(
            "s3",
            config=Config(
                max_pool_connections=CONNECTIONS,
                retries={"max_attempts": 4, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
            ),
        )

    def key(self, name: str) -> str:
        return self.config.prefix + name

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    # ------------------------------------------------------------ whole objects

    def exists(self, name: str) -> bool:
        return self._fetch(name, body=False) is not None

    def etag(self, name: str) -> str | None:
        """The object's ETag without its quotes (for a single PUT: the MD5 of its bytes), or None."""
        found = self._fetch(name, body=False)
        return None if found is None else found[1].strip('"')

    def get(self, name: str) -> bytes:
        found = self._fetch(name)
        if found is None:
            raise NotFound(f"{self.url(name)} is not in the remote store")
        return found[0]

    def put(self, name: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._failed("write", name, exc) from exc

    def list(self, folder: str) -> list[str]:
        """Names of the objects under ``folder`` (relative to the prefix)."""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.key(folder))
            return [item["Key"][len(self.config.prefix) :] for page in pages for item in page.get("Contents", [])]
        except (ClientError, BotoCoreError) as exc:
            raise self._failed("list", folder, exc) from exc

    # ------------------------------------------------------------ documents with conditional writes

    def read_document(self, name: str) -> tuple[dict[str, Any], str] | None:
        """The JSON document and its ETag, or None if there is none."""
        found = self._fetch(name)
        return None if found is None else (json.loads(found[0]), found[1])

    def _fetch(self, name: str, body: bool = True) -> tuple[bytes, str] | None:
        """(its bytes, its ETag), or None if the store has no such object; ``body=False`` only asks."""
        try:
            if not body:
                return b"", self.client.head_object(Bucket=self.bucket, Key=self.key(name))["ETag"]
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key(name))
            return answer["Body"].read(), answer["ETag"]
        except ClientError as exc:
            if _code(exc) in MISSING:
                return None
            raise self._failed("read", name, exc) from exc
        except BotoCoreError as exc:
            raise self._failed("read", name, exc) from exc

    def write_document(self, name: str, document: dict[str, Any], *, replacing: str | None) -> str:
        """Write if the key still holds the version ``replacing`` (an ETag), or, with None, if it is
        absent; Conflict if another writer got there first. Returns the new ETag."""
        body = json.dumps(document, indent=1, sort_keys=True).encode()
        condition = {"IfMatch": replacing} if replacing else {"IfNoneMatch": "*"}
        try:
            answer = self.client.put_object(
                Bucket=self.bucket, Key=self.key(name), Body=body, ContentType="application/json", **condition
            )
            return answer["ETag"]
        except ClientError as exc:
            if _code(exc) in CHANGED:
                raise Conflict(f"{self.url(name)} was changed by another node meanwhile") from None
            raise self._failed("write", name, exc) from exc
        except BotoCoreError as exc:
            raise self._failed("write", name, exc) from exc

    def _failed(self, action: str, name: str, exc: Exception) -> StoreUnreachable:
        if isinstance(exc, ClientError) and _code(exc) == "NoSuchBucket":
            return StoreUnreachable(
                f"the bucket {self.bucket!r} of STASIS_REMOTE does not exist at the endpoint; create it first"
            )
        return StoreUnreachable(f"could not {action} {self.url(name)}: {exc}")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
