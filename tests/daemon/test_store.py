"""The SQLite store: names, the journal of intents and outcomes, checkpoints, an old home's migration."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from stasis.daemon.core.store import Store
from stasis.errors import NameTaken, SandboxNotFound, StateError
from stasis.models import CheckpointInfo, CheckpointType, CreateSandboxRequest, SandboxSpec
from stasis.models import SandboxStatus as S

pytestmark = pytest.mark.fast


def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "stasis.db")


def test_a_sandbox_is_found_by_id_and_by_name(tmp_path: Path) -> None:
    db = store(tmp_path)
    info = db.insert_sandbox("sb-000000000001", "web", SandboxSpec(), "default-abc")
    assert db.get("web").id == db.get("sb-000000000001").id == info.id
    assert (info.status, info.image_key, info.from_checkpoint) == (S.PENDING, "default-abc", None)
    with pytest.raises(SandboxNotFound, match="stasis ls"):
        db.get("nope")


def test_names_are_unique_among_live_sandboxes_only(tmp_path: Path) -> None:
    db = store(tmp_path)
    db.insert_sandbox("sb-000000000001", "web", SandboxSpec(), "k")
    with pytest.raises(NameTaken):
        db.insert_sandbox("sb-000000000002", "web", SandboxSpec(), "k")
    db.transition("sb-000000000001", S.TERMINATING)
    db.transition("sb-000000000001", S.TERMINATED)
    assert db.insert_sandbox("sb-000000000003", "web", SandboxSpec(), "k").name == "web"


def test_each_transition_is_journalled_as_intent_or_outcome(tmp_path: Path) -> None:
    db = store(tmp_path)
    db.insert_sandbox("sb-000000000001", None, SandboxSpec(), "k")
    db.transition("sb-000000000001", S.RUNNING, backend_state={"boots": 1})
    db.transition("sb-000000000001", S.SUSPENDING)
    info = db.transition("sb-000000000001", S.SUSPENDED, last_suspend_seconds=0.5)
    journal = db.transitions("sb-000000000001")
    assert [(t["phase"], t["to_status"]) for t in journal] == [
        ("intent", "pending"), ("outcome", "running"), ("intent", "suspending"), ("outcome", "suspended"),
    ]  # fmt: skip
    assert (info.runtime, info.last_suspend_seconds) == ({"boots": 1}, 0.5)


def test_an_illegal_transition_changes_nothing(tmp_path: Path) -> None:
    db = store(tmp_path)
    db.insert_sandbox("sb-000000000001", None, SandboxSpec(), "k")
    with pytest.raises(StateError, match="pending → suspended"):
        db.transition("sb-000000000001", S.SUSPENDED)
    assert db.get("sb-000000000001").status == S.PENDING
    assert len(db.transitions("sb-000000000001")) == 1


def test_a_checkpoint_is_visible_only_once_sealed(tmp_path: Path) -> None:
    db = store(tmp_path)
    ckpt = CheckpointInfo(
        id="ck-000000000001", name="snap", type=CheckpointType.MEMORY, sandbox_id="sb-1", sandbox_name=None,
        image="k", spec=SandboxSpec(), backend="gvisor", runtime={}, created_at=0, expires_at=None, sha256=None,
        size_bytes=0, metadata={},
    )  # fmt: skip
    table = db.tables.checkpoints
    table.insert_checkpoint(ckpt)
    assert table.list_checkpoints() == [] and table.unfinished_checkpoints() == ["ck-000000000001"]
    table.seal_checkpoint(ckpt.model_copy(update={"sha256": "ab"}))
    assert table.get_checkpoint("snap").sha256 == "ab" and table.unfinished_checkpoints() == []
    with pytest.raises(NameTaken):
        table.insert_checkpoint(ckpt.model_copy(update={"id": "ck-000000000002"}))


def test_a_checkpoint_record_from_before_the_rename_still_reads(tmp_path: Path) -> None:
    old = {"id": "ck-1", "name": None, "type": "memory", "sandbox_id": "sb", "sandbox_name": None, "image": "k",
           "spec": {}, "backend": "gvisor", "backend_state": {"runsc_version": "v"}, "created_at": 0,
           "expires_at": None, "sha256": None, "size_bytes": 0, "metadata": {}}  # fmt: skip
    assert CheckpointInfo.model_validate(old).runtime == {"runsc_version": "v"}


def test_a_home_from_before_the_daemon_fact_columns_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "stasis.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT, status TEXT NOT NULL, spec TEXT NOT NULL,"
            " backend_state TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL, updated_at REAL NOT NULL,"
            " last_activity REAL NOT NULL, error TEXT, last_suspend_seconds REAL, last_resume_seconds REAL)"
        )
        state = {"image_key": "default-old", "from_checkpoint": "ck-9", "runsc_version": "v1"}
        db.execute("INSERT INTO sandboxes VALUES ('sb-000000000001', 'w', 'suspended', '{}', ?, 0, 0, 0,"
                   " NULL, NULL, NULL)", (json.dumps(state),))  # fmt: skip
    info = Store(path).get("w")
    assert (info.image_key, info.from_checkpoint, info.runtime) == ("default-old", "ck-9", {"runsc_version": "v1"})


def test_the_list_pages_through_live_sandboxes_without_pool_members(tmp_path: Path) -> None:
    db = store(tmp_path)
    for n in range(7):
        db.insert_sandbox(f"sb-00000000000{n}", f"box{n}", SandboxSpec(), "default-abc")
    db.insert_sandbox("sb-0000000000pm", None, SandboxSpec(), "default-abc", pool="warm")
    db.transition("sb-000000000003", S.TERMINATING)
    db.transition("sb-000000000003", S.TERMINATED)
    seen, after = [], None
    while page := db.list(include_pooled=False, limit=2, after=after):
        seen += [info.name for info in page]
        after = (page[-1].created_at, page[-1].id)
    assert seen == ["box0", "box1", "box2", "box4", "box5", "box6"]
    assert "sb-0000000000pm" in {info.id for info in db.list()}  # recovery sees members


def test_a_claim_hands_out_each_member_once_with_the_callers_name(tmp_path: Path) -> None:
    db = store(tmp_path)
    for n in range(2):
        db.insert_sandbox(f"sb-00000000000{n}", None, SandboxSpec(timeout_secs=None), "default-abc", pool="warm")
        db.transition(f"sb-00000000000{n}", S.RUNNING)
    db.insert_sandbox("sb-000000000009", None, SandboxSpec(), "default-old", pool="warm")
    db.transition("sb-000000000009", S.RUNNING)
    first = db.claim_member("warm", "default-abc", CreateSandboxRequest(name="mine", timeout_secs=60))
    assert first is not None and (first.name, first.pool, first.from_pool) == ("mine", None, "warm")
    assert first.spec.timeout_secs == 60
    with pytest.raises(NameTaken):
        db.claim_member("warm", "default-abc", CreateSandboxRequest(name="mine"))
    second = db.claim_member("warm", "default-abc", CreateSandboxRequest())
    assert second is not None and second.id != first.id
    assert db.claim_member("warm", "default-abc", CreateSandboxRequest()) is None  # the other is a stale build
    assert [m.id for m in db.pool_members("warm")] == ["sb-000000000009"]
