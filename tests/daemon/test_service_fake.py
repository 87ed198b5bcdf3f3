"""The service's lifecycle, recovery and idle reaper on the FakeBackend (real agent, no runsc/QEMU)."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
from collections.abc import Awaitable, Callable

import pytest

from stasis import procs
from stasis.backends.base import HostState
from stasis.daemon.core.service import SandboxService
from stasis.daemon.core.states import require
from stasis.daemon.rooms.checkpointing import Checkpoints
from stasis.daemon.rooms.idle import IdleReaper
from stasis.daemon.rooms.operations import GuestOperations
from stasis.errors import BackendError, StateError, Unsupported
from stasis.models import RunRequest
from stasis.models import SandboxStatus as S
from stasis.netpolicy import NetworkPolicy
from stasis.paths import Paths
from tests.fakes import FakeBackend
from tests.fastkit import Clock, create, fake, fake_home, running_service, statuses

pytestmark = pytest.mark.fast


def run(scenario: Callable[[SandboxService], Awaitable[None]], clock: Clock | None = None) -> None:
    async def main() -> None:
        async with running_service(fake_home("service"), clock=clock) as service:
            await scenario(service)

    asyncio.run(main())


async def echo(service: SandboxService, ref: str, text: str) -> str:
    result = await GuestOperations(service).run(ref, RunRequest(cmd=["echo", text]))
    return base64.b64decode(result.stdout_b64).decode()


def test_a_lifecycle_walks_the_exact_transitions() -> None:
    async def scenario(service: SandboxService) -> None:
        info = await create(service, "life")
        assert info.status == S.RUNNING and info.runtime == {"boots": 1}
        await service.suspend("life")
        assert await echo(service, "life", "awake") == "awake\n"  # a request resumes it
        await service.terminate("life")
        assert statuses(service, info.id) == [
            "pending", "running", "suspending", "suspended", "resuming", "running", "terminating", "terminated",
        ]  # fmt: skip
        assert not (service.paths.sandboxes / info.id).exists()

    run(scenario)


def test_a_failed_suspend_leaves_the_sandbox_running_with_the_error_recorded() -> None:
    async def scenario(service: SandboxService) -> None:
        info = await create(service, "stubborn")
        fake(service).fail_next["suspend"] = BackendError("disk on fire")
        with pytest.raises(BackendError):
            await service.suspend("stubborn")
        after = service.get("stubborn")
        assert after.status == S.RUNNING and "disk on fire" in (after.error or "")
        assert await echo(service, "stubborn", "still here") == "still here\n"
        assert statuses(service, info.id)[-2:] == ["suspending", "running"]

    run(scenario)


def test_a_failed_create_leaves_nothing_and_frees_the_name() -> None:
    async def scenario(service: SandboxService) -> None:
        fake(service).fail_next["start"] = BackendError("no luck")
        with pytest.raises(BackendError):
            await create(service, "phoenix")
        assert service.list() == []
        assert list(service.paths.sandboxes.iterdir()) == []
        assert (await create(service, "phoenix")).status == S.RUNNING

    run(scenario)


def test_wrong_state_errors_say_what_to_do() -> None:
    async def scenario(service: SandboxService) -> None:
        await create(service, "sleepy")
        await service.suspend("sleepy")
        with pytest.raises(StateError, match="resume it first") as caught:
            require(service.store.get("sleepy"), S.RUNNING)
        assert caught.value.details == {"status": "suspended", "required": ["running"]}
        with pytest.raises(Unsupported, match="created without network"):
            await service.set_network("sleepy", NetworkPolicy())

    run(scenario)


async def restart(paths: Paths, crash: Callable[[SandboxService], Awaitable[None]]) -> SandboxService:
    """Leave a service as a killed daemon would (no close), then start a new one on the same home."""
    first = SandboxService(paths, backends={"fake": FakeBackend(paths)})
    await first.start()
    await crash(first)
    first.watchdog.close()  # a dead daemon watches nothing
    first.store.close()
    return first


def test_recovery_adopts_a_running_sandbox_whose_suspend_was_cut_off() -> None:
    async def main() -> None:
        paths = fake_home("recover")

        async def crash(service: SandboxService) -> None:
            info = await create(service, "cut")
            service.store.transition(info.id, S.SUSPENDING)  # the intent was written, then the daemon died

        await restart(paths, crash)
        async with running_service(paths) as service:
            assert service.get("cut").status == S.RUNNING
            assert await echo(service, "cut", "alive") == "alive\n"
            assert statuses(service, service.get("cut").id)[-1] == "running"

    asyncio.run(main())


def test_recovery_fails_a_sandbox_whose_processes_died_and_resume_boots_it_again() -> None:
    async def main() -> None:
        paths = fake_home("lost")

        async def crash(service: SandboxService) -> None:
            info = await create(service, "lost")
            box = service.boxes.box(service.store.get(info.id))
            pid = fake(service).pid(box)
            service.watchdog.close()  # the daemon went down with the host
            os.killpg(pid, signal.SIGKILL)  # the host rebooted under it: gone before the next daemon looks
            assert await procs.wait_gone(pid, 10)

        await restart(paths, crash)
        async with running_service(paths) as service:
            failed = service.get("lost")
            assert failed.status == S.FAILED and "host restart" in (failed.error or "")
            with pytest.raises(StateError, match="stasis resume lost"):
                await echo(service, "lost", "x")  # never silently resumed
            resumed = await service.resume("lost")
            assert resumed.status == S.RUNNING and resumed.runtime == {"boots": 2}

    asyncio.run(main())


def test_recovery_completes_a_suspend_found_done_on_the_host() -> None:
    async def main() -> None:
        paths = fake_home("done")

        async def crash(service: SandboxService) -> None:
            info = await create(service, "done")
            service.store.transition(info.id, S.SUSPENDING)
            box = service.boxes.box(service.store.get(info.id))
            await fake(service).suspend(box, service._channels[info.id])  # the work finished, the outcome never

        await restart(paths, crash)
        async with running_service(paths) as service:
            info = service.get("done")
            assert info.status == S.SUSPENDED
            assert await fake(service).host_state(service.boxes.box(info)) == HostState.SUSPENDED
            assert await echo(service, "done", "back") == "back\n"

    asyncio.run(main())


def test_recovery_reaps_agents_and_directories_nobody_owns() -> None:
    async def main() -> None:
        paths = fake_home("orphans")

        async def crash(service: SandboxService) -> None:
            info = await create(service, "orphan")
            service.store.db.execute("DELETE FROM sandboxes WHERE id = ?", (info.id,))

        await restart(paths, crash)
        assert list(paths.sandboxes.iterdir())
        async with running_service(paths):
            assert list(paths.sandboxes.iterdir()) == []

    asyncio.run(main())


def test_the_idle_reaper_suspends_named_and_removes_unnamed_sandboxes() -> None:
    clock = Clock()

    async def scenario(service: SandboxService) -> None:
        named = await create(service, "keeper", timeout_secs=60)
        unnamed = await create(service, None, timeout_secs=60)
        busy = await create(service, "busy", timeout_secs=60)
        reaper = IdleReaper(service, Checkpoints(service, service.tables.checkpoints))
        clock.advance(59)
        assert reaper.tick() == []  # not idle yet: nothing happens
        with service.activity.busy(busy.id):  # a request under way holds the clock
            clock.advance(2)
            acting = reaper.tick()
            assert len(acting) == 2
            await asyncio.gather(*acting)
        assert service.get(named.id).status == S.SUSPENDED
        assert service.get(unnamed.id).status == S.TERMINATED
        assert service.get(busy.id).status == S.RUNNING

    run(scenario, clock)


def test_concurrent_requests_to_a_suspended_sandbox_share_one_resume() -> None:
    async def scenario(service: SandboxService) -> None:
        info = await create(service, "crowd")
        await service.suspend("crowd")
        replies = await asyncio.gather(*(echo(service, "crowd", str(i)) for i in range(8)))
        assert replies == [f"{i}\n" for i in range(8)]
        assert statuses(service, info.id).count("resuming") == 1

    run(scenario)


def test_a_sandbox_that_dies_on_the_host_is_failed_at_once_and_its_waiters_told_why() -> None:
    async def scenario(service: SandboxService) -> None:
        info = await create(service, "mortal")
        ops = GuestOperations(service)
        waiting = asyncio.ensure_future(ops.run("mortal", RunRequest(cmd=["sleep", "600"])))
        await asyncio.sleep(0.3)
        os.killpg(fake(service).pid(service.boxes.box(service.store.get(info.id))), signal.SIGKILL)
        with pytest.raises(StateError, match="fake agent died"):  # told why, long before its 600 s command
            await asyncio.wait_for(waiting, 120)
        assert service.get("mortal").status == S.FAILED
        assert (await service.resume("mortal")).status == S.RUNNING  # boots again with its files
        assert await echo(service, "mortal", "again") == "again\n"

    run(scenario)


def test_removal_goes_ahead_when_another_operation_is_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    from stasis.daemon.core import lifecycle as service_module

    monkeypatch.setattr(service_module, "FORCE_AFTER", 0.2)

    async def scenario(service: SandboxService) -> None:
        info = await create(service, "wedged")
        await service.lock(info.id).acquire()  # a suspend whose runsc call hangs holds it
        service.store.transition(info.id, S.SUSPENDING)
        removed = await asyncio.wait_for(service.terminate("wedged"), 10)
        assert removed.status == S.TERMINATED
        assert not (service.paths.sandboxes / info.id).exists()

    run(scenario)
