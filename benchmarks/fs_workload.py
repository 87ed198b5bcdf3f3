"""The file-system workload of benchmarks/fs.py: run as-is in a sandbox and on the bare host.

Standard library only (it runs on any image with python3 and git). Prints one JSON object: the
seconds each phase took. ``python3 fs_workload.py DIR [SCALE]``; DIR is made and used as scratch.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable

WORK = sys.argv[1]
SCALE = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
timings: dict[str, float] = {}


def phase(name: str, action: Callable[[], object]) -> None:
    started = time.perf_counter()
    action()
    timings[name] = time.perf_counter() - started


def n(count: int) -> int:
    return max(1, int(count * SCALE))


def sqlite_workload(path: str, journal: str, synchronous: str) -> None:
    """Single-row inserts, executemany, range and LIKE queries, updates, deletes, a transaction,
    aggregates, a join, and 4 reader threads, as sandbox vendors publish them."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA journal_mode={journal}")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL, owner INTEGER)")
    db.execute("CREATE TABLE owners (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("CREATE INDEX items_price ON items(price)")
    for i in range(n(1000)):  # each its own transaction: one commit (and its syncs) apiece
        db.execute("INSERT INTO items (name, price, owner) VALUES (?, ?, ?)", (f"single-{i}", i * 0.5, i % 100))
    db.execute("BEGIN")
    db.executemany("INSERT INTO items (name, price, owner) VALUES (?, ?, ?)",
                   ((f"bulk-{i}", (i * 7919) % 10000 / 10, i % 100) for i in range(n(50000))))  # fmt: skip
    db.executemany("INSERT INTO owners (id, name) VALUES (?, ?)", ((i, f"owner-{i}") for i in range(100)))
    db.execute("COMMIT")
    for i in range(n(300)):
        db.execute("SELECT count(*), avg(price) FROM items WHERE price BETWEEN ? AND ?", (i, i + 50)).fetchall()
    for i in range(n(30)):
        db.execute("SELECT count(*) FROM items WHERE name LIKE ?", (f"bulk-{i}%",)).fetchall()
    for i in range(n(500)):
        db.execute("UPDATE items SET price = price + 1 WHERE id = ?", (i * 13 + 1,))
    db.execute("DELETE FROM items WHERE id % 97 = 0")
    db.execute("BEGIN")
    for i in range(n(2000)):
        db.execute("UPDATE items SET owner = ? WHERE id = ?", (i % 50, i + 1))
    db.execute("COMMIT")
    db.execute("SELECT owner, count(*), sum(price), max(price) FROM items GROUP BY owner").fetchall()
    db.execute("SELECT o.name, count(*) FROM items i JOIN owners o ON i.owner = o.id GROUP BY o.name").fetchall()

    def reader() -> None:
        conn = sqlite3.connect(path)
        for i in range(n(100)):
            conn.execute("SELECT * FROM items WHERE price > ? LIMIT 50", (i,)).fetchall()
        conn.close()

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    db.close()


def write_tree(root: str) -> None:
    """About 20,000 small files in 400 directories, as a source tree has them."""
    body = b"x = 1\n" * 160  # ~1 KiB
    for d in range(n(400)):
        directory = os.path.join(root, f"pkg{d}", "sub")
        os.makedirs(directory)
        for f in range(50):
            with open(os.path.join(directory, f"mod{f}.py"), "wb") as out:
                out.write(body + str(d * 50 + f).encode())


def run(*argv: str, cwd: str) -> None:
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def large_file(path: str) -> None:
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as out:
        for _ in range(n(256)):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


def read_file(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def main() -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    phase("sqlite, WAL + synchronous=NORMAL", lambda: sqlite_workload(f"{WORK}/wal.db", "WAL", "NORMAL"))
    phase("sqlite, DELETE journal + synchronous=FULL", lambda: sqlite_workload(f"{WORK}/full.db", "DELETE", "FULL"))
    tree = f"{WORK}/tree"
    phase("write ~20k small files", lambda: write_tree(tree))
    phase("tar the tree", lambda: run("tar", "cf", f"{WORK}/tree.tar", "tree", cwd=WORK))
    shutil.rmtree(tree)
    phase("untar ~20k small files", lambda: run("tar", "xf", f"{WORK}/tree.tar", cwd=WORK))
    if shutil.which("git"):
        env = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
        phase("git init + add + commit", lambda: (run("git", "init", "-q", cwd=tree),
                                                  run("git", *env, "add", "-A", cwd=tree),
                                                  run("git", *env, "commit", "-qm", "tree", cwd=tree)))  # fmt: skip
        phase("git status (x3)", lambda: [run("git", "status", "--porcelain", cwd=tree) for _ in range(3)])
    phase("write 256 MiB + fsync", lambda: large_file(f"{WORK}/large.bin"))
    phase("read 256 MiB", lambda: read_file(f"{WORK}/large.bin"))
    shutil.rmtree(WORK, ignore_errors=True)
    print(json.dumps(timings))


if __name__ == "__main__":
    main()
