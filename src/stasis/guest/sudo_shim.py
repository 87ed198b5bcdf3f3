#!/usr/bin/python3
"""sudo for images whose user has passwordless sudo (E2B's), installed as /usr/local/bin/sudo: where setuid
cannot work (gVisor), it asks the stasis agent (:mod:`stasis.guest.sudo`), which runs the command with this
process's stdin, stdout and stderr; elsewhere it is the real /usr/bin/sudo. The flags agent code uses are
understood (-u USER, -E, -H, -n, -i, -s, --); others are refused saying so. Standard library only."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import signal
import socket
import struct
import sys

REAL = "/usr/bin/sudo"
SOCKETS = "/dev/stasis-sudo"  # SOCKETS/NAME: the agent's, for user NAME alone (theirs, 0600, in a root directory)
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what sudo's env_reset keeps, and stasis' mark of the run (so a timeout or kill of it reaches the command too)
KEPT = ("TERM", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "DISPLAY", "COLORTERM", "STASIS_EXEC_ID")
QUIET = ("-n", "--non-interactive", "-H", "--set-home", "-k", "--reset-timestamp", "-S", "--stdin", "-P", "-b")


def broker() -> socket.socket | None:
    """The agent's socket for this user, if the agent serves sudo here (gVisor) and this user may use it."""
    try:
        path = os.path.join(SOCKETS, pwd.getpwuid(os.getuid()).pw_name)
    except KeyError:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def parse(args: list[str]) -> tuple[dict[str, object], list[str]]:
    opts: dict[str, object] = {"user": "root", "keep_env": False, "login": False, "shell": False}
    rest = list(args)
    while rest and rest[0].startswith("-") and rest[0] != "-":
        flag = rest.pop(0)
        if flag == "--":
            break
        if flag in QUIET:
            continue
        if flag in ("-E", "--preserve-env") or flag.startswith("--preserve-env="):
            opts["keep_env"] = True
        elif flag in ("-u", "--user"):
            opts["user"] = rest.pop(0) if rest else fail("sudo: option requires an argument -- 'u'")
        elif flag.startswith("-u"):
            opts["user"] = flag[2:]
        elif flag.startswith("--user="):
            opts["user"] = flag.split("=", 1)[1]
        elif flag in ("-i", "--login"):
            opts["login"] = True
        elif flag in ("-s", "--shell"):
            opts["shell"] = True
        elif flag in ("-v", "--validate", "-K", "--remove-timestamp"):
            sys.exit(0)
        elif flag in ("-l", "--list"):
            print("User may run the following commands:\n    (ALL : ALL) NOPASSWD: ALL")
            sys.exit(0)
        else:
            fail(f"sudo: option {flag!r} is not supported by stasis' sudo (gVisor); -u, -E, -H, -n, -i, -s are")
    return opts, rest


def fail(message: str) -> str:
    print(message, file=sys.stderr)
    sys.exit(1)


def request(opts: dict[str, object], rest: list[str]) -> dict[str, object]:
    user = str(opts["user"])
    try:
        target = pwd.getpwuid(int(user[1:])) if user.startswith("#") else pwd.getpwnam(user)
    except (KeyError, ValueError):
        fail(f"sudo: unknown user {user}")
    try:
        caller = pwd.getpwuid(os.getuid())
    except KeyError:
        fail(f"sudo: you (uid {os.getuid()}) do not exist in /etc/passwd")
    env = dict(os.environ) if opts["keep_env"] else {k: os.environ[k] for k in KEPT if k in os.environ}
    env.update(HOME=target.pw_dir, USER=target.pw_name, LOGNAME=target.pw_name, SHELL=target.pw_shell,
               SUDO_USER=caller.pw_name, SUDO_UID=str(caller.pw_uid), SUDO_GID=str(caller.pw_gid),
               SUDO_COMMAND=" ".join(rest))  # fmt: skip
    if not opts["keep_env"]:
        env["PATH"] = SECURE_PATH
    cwd = os.getcwd() if os.path.isdir(".") else "/"
    if opts["login"]:
        argv = [target.pw_shell, "-l", *(["-c", shlex.join(rest)] if rest else [])]
        cwd = target.pw_dir
    elif opts["shell"]:
        shell = os.environ.get("SHELL") or target.pw_shell
        argv = [shell, *(["-c", shlex.join(rest)] if rest else [])]
    elif rest:
        argv = rest
    else:
        fail("usage: sudo [-u user] [-E] [-H] [-n] [-i | -s] [--] command [arg ...]")
    return {"argv": argv, "env": env, "cwd": cwd, "user": target.pw_name}


def descriptors() -> list[int]:
    """Our stdin, stdout and stderr, each /dev/null if it is closed."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def main() -> None:
    conn = broker()
    if conn is None:  # setuid works here: the real sudo, with everything it reads (sudoers, its flags)
        os.execv(REAL, [REAL, *sys.argv[1:]])
    opts, rest = parse(sys.argv[1:])
    body = json.dumps(request(opts, rest)).encode()
    socket.send_fds(conn, [struct.pack("!I", len(body))], descriptors())
    conn.sendall(body)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, lambda n, _: conn.sendall(json.dumps({"signal": n}).encode() + b"\n"))
    with conn.makefile("rb") as replies:
        line = replies.readline()
    reply = json.loads(line) if line else {"error": "the stasis agent hung up"}
    if "error" in reply:
        fail(f"sudo: {reply['error']}")
    code = int(reply["exit"])
    sys.exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
