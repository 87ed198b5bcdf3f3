"""Checks of what clients send, shared by the wire models and the daemon: names, ids, commands,
environment, users and paths; and pydantic's errors said as one readable sentence."""

from __future__ import annotations

import re
from typing import Any

from .backends import BACKENDS

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ID_PATTERN = re.compile(r"^sb-[0-9a-z]{12}$")
EXEC_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def validate_name(name: str, what: str = "sandbox") -> str:
    """A sandbox's (or ``what``'s) name: 1-63 of letters, digits, '.', '_', '-', starting with a letter or digit."""
    if not NAME_PATTERN.fullmatch(name) or ".." in name:
        shown = name if len(name) <= 80 else name[:80] + "..."
        raise ValueError(
            f"invalid {what} name {shown!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no '/', '..', spaces or control characters)"
        )
    if ID_PATTERN.fullmatch(name):
        raise ValueError(f"invalid {what} name {name!r}: names of the form sb-xxxxxxxxxxxx are reserved for ids")
    return name


def validate_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of: {', '.join(BACKENDS)}")
    return backend


def describe_validation_errors(errors: list[Any]) -> str:
    """pydantic's error list as one readable sentence: 'name: invalid sandbox name ...; cpus: ...'."""
    problems = []
    for err in errors:
        where = ".".join(str(part) for part in err.get("loc", ()) if part != "body")
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems) or "invalid request"


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def valid_utf8(text: str) -> bool:
    """JSON allows a lone surrogate (``"\\ud800"``); nothing can encode it for a sandbox."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def validate_command(cmd: list[str]) -> list[str]:
    if any("\0" in part for part in cmd):
        raise ValueError("the command must not contain NUL bytes")
    if not all(valid_utf8(part) for part in cmd):
        raise ValueError("the command must be valid UTF-8 (it has a lone surrogate, such as \\ud800)")
    return cmd


def validate_env(env: dict[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"invalid environment variable name {key[:80]!r}: use letters, digits and '_'")
        if "\0" in value:
            raise ValueError(f"environment variable {key!r} must not contain NUL bytes")
        if not valid_utf8(value):
            raise ValueError(f"environment variable {key!r} must be valid UTF-8 (it has a lone surrogate)")
    return env


USER_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$")


def validate_user(user: str | None) -> str | None:
    if user is not None and not USER_PATTERN.fullmatch(user):
        raise ValueError(f"invalid user {user[:40]!r}: use a name or uid, optionally :group or :gid")
    return user


def validate_path(path: str | None) -> str | None:
    if path is not None and "\0" in path:
        raise ValueError("the working directory must not contain NUL bytes")
    return path


def all_utf8(value: Any) -> bool:
    """Whether every string in ``value`` (a request's JSON: dicts, lists, strings) is valid UTF-8."""
    if isinstance(value, str):
        return value.isascii() or valid_utf8(value)
    if isinstance(value, dict):
        return all(all_utf8(k) and all_utf8(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(all_utf8(v) for v in value)
    return True
