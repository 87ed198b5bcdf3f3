"""A real S3-compatible server (moto's, over HTTP on loopback) and daemons that share it as their remote
store: each daemon, with its own STASIS_HOME, stands in for another node."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.conftest import Daemon, new_home, terminate_all

BUCKET = "stasis-test"


@dataclass
class S3:
    server: ThreadedMotoServer
    port: int
    env: dict[str, str]

    def client(self):  # type: ignore[no-untyped-def]
        return boto3.client(
            "s3", endpoint_url=self.env["AWS_ENDPOINT_URL"], aws_access_key_id="test", aws_secret_access_key="test",
            region_name="us-east-1",
        )  # fmt: skip

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """The same server again on the same port; moto keeps its objects in this process."""
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


@pytest.fixture
def s3(request: pytest.FixtureRequest) -> Iterator[S3]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    prefix = request.node.name[:40].replace("[", "-").replace("]", "") + "-" + secrets.token_hex(3)
    env = {
        "STASIS_REMOTE": f"s3://{BUCKET}/{prefix}",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
    }
    store = S3(server, port, env)
    store.client().create_bucket(Bucket=BUCKET)
    yield store
    store.server.stop()


@pytest.fixture
def nodes(s3: S3) -> Iterator[tuple[Daemon, Daemon]]:
    """Two daemons (nodes "node-a" and "node-b") on one remote store; started by the test."""
    pair = []
    for name in ("node-a", "node-b"):
        daemon = Daemon(new_home(name))
        daemon.sticky_env.update(s3.env, STASIS_NODE=name)
        pair.append(daemon)
    yield pair[0], pair[1]
    for daemon in pair:
        if daemon.proc is not None and daemon.proc.poll() is not None:
            daemon.start()
        if daemon.proc is not None:
            terminate_all(daemon)
            daemon.stop()
