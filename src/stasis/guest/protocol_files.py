"""The guest protocol's file operations and their results (see :mod:`.protocol`, which re-exports them all).

Standard library only: shipped into every sandbox beside the agent."""

from __future__ import annotations

from dataclasses import dataclass, field

from .wire import Empty, Operation


@dataclass
class FileData:
    data: str
    size: int
    eof: bool


@dataclass
class PathResult:
    path: str
    size: int | None = None


@dataclass
class FileStat:
    name: str
    path: str
    type: str  # "file" | "directory" | "symlink" | "other"
    size: int
    mode: int
    mtime: float
    owner: str = ""  # user and group names (the number when the guest has no name for it)
    group: str = ""
    target: str | None = None  # a symlink's target
    labels: dict[str, str] | None = None  # its user.e2b.* extended attributes, prefix stripped (asked for: labels)


@dataclass
class DirListing:
    path: str
    entries: list[FileStat] = field(default_factory=list, metadata={"of": FileStat})


# ---------------------------------------------------------------- files


@dataclass
class ReadFile(Operation[FileData]):
    op = "file_read"
    result = FileData
    path: str
    offset: int = 0
    length: int = 4 << 20


@dataclass
class WriteFile(Operation[PathResult]):
    """One chunk of an atomic write: chunks go to a temp file renamed over ``path`` by the ``final`` one."""

    op = "file_write"
    result = PathResult
    path: str
    data: str = ""
    offset: int = 0
    final: bool = True
    upload_id: str = "x"
    mode: int = 0o644
    make_parents: bool = True
    abort: bool = False  # the upload was cut off: remove its temp file now
    owner: str | None = None  # a user of the guest: the file (and parents it makes) become theirs
    labels: dict[str, str] | None = None  # with the first chunk: user.e2b.* extended attributes it gets (E2B's)


@dataclass
class ExtractTar(Operation[PathResult]):
    """Unpack the tar file ``archive`` (in the sandbox) as directory ``path``, which appears whole or not at
    all (``replace``: instead of what is there); the archive is removed."""

    op = "dir_extract"
    result = PathResult
    archive: str
    path: str
    replace: bool = False


@dataclass
class PackTar(Operation[PathResult]):
    """Pack directory ``path`` into the tar file ``archive`` (in the sandbox)."""

    op = "dir_pack"
    result = PathResult
    path: str
    archive: str


@dataclass
class ListDir(Operation[DirListing]):
    op = "file_list"
    result = DirListing
    path: str
    labels: bool = False  # each entry's user.e2b.* extended attributes too


@dataclass
class StatFile(Operation[FileStat]):
    op = "file_stat"
    result = FileStat
    path: str
    labels: bool = False  # its user.e2b.* extended attributes too


@dataclass
class DeleteFile(Operation[Empty]):
    op = "file_delete"
    result = Empty
    path: str
    recursive: bool = False


@dataclass
class MakeDir(Operation[PathResult]):
    op = "mkdir"
    result = PathResult
    path: str
    exist_ok: bool = True
    owner: str | None = None  # as WriteFile's


@dataclass
class Fifo:
    path: str
    mode: int  # permission bits
    uid: int
    gid: int


@dataclass
class FifoList:
    fifos: list[Fifo] = field(default_factory=list, metadata={"of": Fifo})


@dataclass
class ListFifos(Operation[FifoList]):
    """Named pipes on the root file system, not below ``skip`` (gVisor keeps those a sandbox makes in its
    memory, never on the host: a FILESYSTEM checkpoint adds them from this list)."""

    op = "list_fifos"
    result = FifoList
    skip: list[str] = field(default_factory=list)


@dataclass
class PackChanges(Operation[PathResult]):
    """Pack into the tar file ``archive`` how the root file system differs from the image mounted read-only at
    ``image``, as an overlay's upper layer: what is new or changed, with every parent directory, and a whiteout
    (a character device 0:0) for each name the image has and the root no longer has. Nothing below ``skip``.
    (A sandbox whose writable layer lives in its kernel, gVisor's fast storage: the host cannot read it.)"""

    op = "pack_changes"
    result = PathResult
    image: str
    archive: str
    skip: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- watching directories


@dataclass
class WatchEvent:
    name: str  # the path below the watched directory
    type: str  # "create" | "write" | "remove" | "rename" | "chmod"


@dataclass
class WatchInfo:
    id: str


@dataclass
class WatchEvents:
    events: list[WatchEvent] = field(default_factory=list, metadata={"of": WatchEvent})
    lost: int = 0  # events dropped because nobody read them (the queue holds WATCH_QUEUE)
    closed: bool = False  # the watched directory is gone


@dataclass
class StartWatch(Operation[WatchInfo]):
    """Watch a directory (and, ``recursive``, those below it, made later ones too) with inotify."""

    op = "watch_start"
    result = WatchInfo
    path: str
    recursive: bool = False


@dataclass
class ReadWatch(Operation[WatchEvents]):
    """The events since the last read; waits up to ``wait`` seconds for one."""

    op = "watch_read"
    result = WatchEvents
    id: str
    wait: float = 0.0


@dataclass
class StopWatch(Operation[Empty]):
    op = "watch_stop"
    result = Empty
    id: str
