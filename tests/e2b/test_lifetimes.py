"""One lifetime per sandbox (issue 39): E2B's timeout is the sandbox's own deadline, ended by the one reaper
(the idle reaper) with its idle action; the E2B face keeps no lifetime and runs no reaper. A stasis sandbox
that E2B merely sees (listed, looked up, connected to) keeps stasis' own idle policy (issue 38, repro 3)."""

from __future__ import annotations

import asyncio
import json

import pytest

from stasis.daemon import app as _app  # noqa: F401 (the daemon package is imported through its app)
from stasis.daemon import wiring
from stasis.daemon.faces.e2b.room import Defaults
from stasis.errors import InvalidRequest
from stasis.models import CreateSandboxRequest, SandboxStatus
from tests.fastkit import Clock, create, fake_home, running_service

pytestmark = pytest.mark.fast

S = SandboxStatus


def test_a_stasis_sandbox_seen_through_e2b_outlives_any_e2b_lifetime() -> None:
    clock = Clock()

    async def main() -> None:
        paths = fake_home("e2b-lifetimes")
        async with running_service(paths, clock=clock) as service:
            rooms = wiring.build(paths, service)
            e2b = rooms.e2b
            keep = await create(service, "keep", timeout_secs=3600)
            listed = {info.id: (info, record) for info, record in e2b.listing()}  # GET /v2/sandboxes
            info, record = listed[keep.id]
            assert not record.e2b
            assert e2b.ends_at(info) == pytest.approx(clock.now + 3600, abs=60)  # its stasis idle deadline
            await e2b.connect("keep", timeout=1)  # the SDK's Sandbox.connect
            e2b.record(e2b.sandbox("keep"))  # GET /sandboxes/{id}
            with pytest.raises(InvalidRequest, match=r"made by stasis, not through E2B.*suspend after 3600 s idle"):
                await e2b.set_timeout("keep", 1)
            assert service.get("keep").deadline is None  # E2B gave it no lifetime
            assert e2b.records.all() == []  # nothing written for it
            clock.advance(3599)
            await asyncio.gather(*rooms.reaper.tick())
            assert service.get(keep.id).status == S.RUNNING

    asyncio.run(main())


def test_an_e2b_timeout_is_the_sandboxs_deadline_and_the_one_reaper_ends_it() -> None:
    """E2B's timeout ends a sandbox used or not (killed, or paused with auto_pause); connect and set_timeout
    move the deadline; a resume starts a new lifetime; the record goes with the sandbox."""
    clock = Clock()

    async def main() -> None:
        paths = fake_home("e2b-deadline")
        async with running_service(paths, clock=clock) as service:
            rooms = wiring.build(paths, service)
            e2b, reaper = rooms.e2b, rooms.reaper
            defaults = Defaults(backend="fake", memory_mb=256)
            service.images.get("default")  # the fake backend boots the default image
            made = []
            for auto_pause in (False, True):
                info, _ = await e2b.create(defaults, "default", 60, auto_pause, {"k": "v"}, {}, None)
                made.append(info)
            killed, paused = made
            assert killed.spec.timeout_secs is None and killed.spec.lifetime_secs == 60  # no idle window: E2B's
            assert killed.deadline == pytest.approx(clock.now + 60)
            assert {i.id: i.idle_action_at for i in service.list()}[killed.id] == pytest.approx(clock.now + 60)

            clock.advance(30)
            await e2b.set_timeout(killed.id, 120)  # from now: 150 s after create
            await e2b.connect(paused.id, 10)  # never shortens: still 60 s after create
            assert service.get(paused.id).deadline == pytest.approx(clock.now + 30)
            with service.activity.busy(paused.id):  # a lifetime ends used or not
                clock.advance(31)
                await asyncio.gather(*reaper.tick())
            assert service.get(paused.id).status == S.SUSPENDED  # auto_pause: memory and processes kept
            assert service.get(killed.id).status == S.RUNNING  # its deadline moved

            clock.advance(90)
            await asyncio.gather(*reaper.tick())
            assert service.get(killed.id).status == S.TERMINATED
            assert [r.sandbox_id for r in e2b.records.all()] == [paused.id]  # the killed one's record went with it

            resumed, _, was_paused = await e2b.connect(paused.id, 20)  # a new lifetime: its last timeout
            assert was_paused and resumed.deadline == pytest.approx(clock.now + 20)
            await e2b.kill(paused.id)
            assert e2b.records.all() == []

    asyncio.run(main())


def test_a_lifetime_is_the_requests_and_an_older_daemons_e2b_lifetime_becomes_the_sandboxs() -> None:
    """A sandbox restored through stasis from an E2B sandbox's snapshot gets stasis' idle policy, not the E2B
    lifetime its spec had; a paused one connected to with a shorter timeout lives that long; a record an older
    daemon wrote with its lifetime in it hands that lifetime to the sandbox at start."""
    clock = Clock()

    async def main() -> None:
        paths = fake_home("e2b-lifetime-edges")
        async with running_service(paths, clock=clock) as service:
            rooms = wiring.build(paths, service)
            e2b = rooms.e2b
            made, _ = await e2b.create(Defaults(backend="fake", memory_mb=256), "default", 3600, True, {}, {}, None)
            snapshot = await e2b.snapshot(made.id, "e2b-snap", memory=False)
            request = CreateSandboxRequest(name="mine", backend="fake", snapshot_id=snapshot.id)
            mine = await service.create("mine", await rooms.front.source(request))
            assert (mine.spec.lifetime_secs, mine.deadline, mine.spec.timeout_secs) == (None, None, 600)

            await e2b.pause(made.id)
            resumed, _, was_paused = await e2b.connect(made.id, 300)
            assert was_paused and resumed.deadline == pytest.approx(clock.now + 300)  # not the 3600 it had

            older = await create(service, "older", timeout_secs=600)
            written = {"sandbox_id": older.id, "template": "base", "started_at": clock.now, "e2b": True,
                       "end_at": clock.now + 120, "auto_pause": True}  # fmt: skip
            (e2b.records.directory / f"{older.id}.json").write_text(json.dumps(written))
            await e2b.sweep()
            upgraded = service.get(older.id)
            assert (upgraded.spec.timeout_secs, upgraded.spec.on_idle) == (None, "suspend")
            assert upgraded.deadline == pytest.approx(clock.now + 120, abs=1)
            assert "end_at" not in (e2b.records.directory / f"{older.id}.json").read_text()  # once

    asyncio.run(main())
