"""E2B lifetimes belong to sandboxes made through the E2B face only (issue 38, repro 3): a stasis sandbox that
E2B merely sees (listed, looked up, connected to) keeps stasis' own idle policy and is never reaped by E2B."""

from __future__ import annotations

import asyncio
import time

import pytest

from stasis.daemon import app as _app  # noqa: F401 (the daemon package is imported through its app)
from stasis.daemon import wiring
from stasis.daemon.faces.e2b.records import Record
from stasis.errors import InvalidRequest
from stasis.models import SandboxStatus
from tests.fastkit import create, fake_home, running_service

pytestmark = pytest.mark.fast


def test_a_stasis_sandbox_seen_through_e2b_outlives_any_e2b_lifetime() -> None:
    async def main() -> None:
        paths = fake_home("e2b-lifetimes")
        async with running_service(paths) as service:
            e2b = wiring.build(paths, service).e2b
            keep = await create(service, "keep", timeout_secs=3600)
            listed = {info.id: record for info, record in e2b.listing()}  # GET /v2/sandboxes
            assert not listed[keep.id].e2b
            assert listed[keep.id].end_at == pytest.approx(time.time() + 3600, abs=60)  # its stasis idle deadline
            await e2b.connect("keep", timeout=1)  # the SDK's Sandbox.connect
            e2b.record(e2b.sandbox("keep"))  # GET /sandboxes/{id}
            with pytest.raises(InvalidRequest, match=r"made by stasis, not through E2B.*suspend after 3600 s idle"):
                e2b.set_timeout("keep", 1)
            await e2b.reap(time.time() + 7 * 24 * 3600)  # a week of E2B's reaper
            assert service.get(keep.id).status == SandboxStatus.RUNNING
            assert e2b.records.all() == []  # nothing written for it: a restarted daemon reaps nothing either
            # an older daemon wrote a lifetime for every sandbox it listed: such a record has no E2B mark
            old = Record(sandbox_id=keep.id, template="default", started_at=time.time(), end_at=time.time() - 1)
            (e2b.records.directory / f"{keep.id}.json").write_text(old.model_dump_json(exclude={"e2b"}))
            await e2b.reap(time.time())
            assert service.get(keep.id).status == SandboxStatus.RUNNING

    asyncio.run(main())
