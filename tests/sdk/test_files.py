"""Files: binary-safe, large, atomic, with clear errors."""

from __future__ import annotations

import hashlib
import os

import pytest

from stasis import FileError, FileNotFound, Sandbox


@pytest.fixture
def sandbox(shared_sandbox: Sandbox) -> Sandbox:
    """One sandbox per backend for the module: its subject is files, not a sandbox's life."""
    return shared_sandbox


def test_every_byte_value_round_trips(sandbox: Sandbox) -> None:
    data = bytes(range(256)) * 4
    sandbox.write_file("/root/bytes.bin", data)
    assert sandbox.read_file("/root/bytes.bin") == data
    assert sandbox.run("sha256sum /root/bytes.bin").stdout.split()[0] == hashlib.sha256(data).hexdigest()


def test_fifty_megabytes_round_trip(sandbox: Sandbox) -> None:
    data = os.urandom(50 * 1024 * 1024)
    entry = sandbox.write_file("/root/big.bin", data)
    assert entry.size == len(data)
    assert sandbox.run("sha256sum /root/big.bin").stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert sandbox.read_file("/root/big.bin") == data


def test_text_and_relative_paths_land_in_home(sandbox: Sandbox) -> None:
    sandbox.write_file("notes/todo.txt", "ünïcode ✓\n")
    assert sandbox.run("cat /root/notes/todo.txt").stdout == "ünïcode ✓\n"


def test_missing_file_and_directory_give_clear_errors(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFound, match=r"/root/missing\.txt"):
        sandbox.read_file("/root/missing.txt")
    with pytest.raises(FileError, match="is a directory"):
        sandbox.read_file("/etc")
    with pytest.raises(FileNotFound):
        sandbox.list_directory("/no/such/dir")


def test_list_stat_and_remove(sandbox: Sandbox) -> None:
    sandbox.write_file("/srv/a.txt", b"a")
    sandbox.make_dir("/srv/sub")
    entries = {e.name: e for e in sandbox.list_directory("/srv")}
    assert entries["a.txt"].type == "file" and entries["a.txt"].size == 1
    assert entries["sub"].type == "directory"
    assert sandbox.stat("/srv/a.txt").mode == 0o644
    sandbox.remove("/srv/a.txt")
    sandbox.remove("/srv/sub", recursive=True)
    assert sandbox.list_directory("/srv") == []


def test_write_replaces_atomically_and_leaves_no_temp_files(sandbox: Sandbox) -> None:
    sandbox.write_file("/root/config", b"old")
    sandbox.write_file("/root/config", b"new" * 1_000_000)
    assert sandbox.read_file("/root/config") == b"new" * 1_000_000
    assert [e.name for e in sandbox.list_directory("/root") if "stasis" in e.name] == []
