"""Checks of `make fuzz` beyond schemathesis' own (loaded through SCHEMATHESIS_HOOKS=fuzz_checks).

An error never echoes a long run of what the client sent (a success may well return the path it was
given): every string the request carried (path, query, headers, body) is cut into 150-character
windows at every 50th character, and none may appear in a 4xx or 5xx response; any echoed run of 200
characters or more contains one of them.
"""

from __future__ import annotations

from typing import Any

import schemathesis

WINDOW, STRIDE = 150, 50


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


@schemathesis.check
def echoes_no_long_input(ctx: Any, response: Any, case: Any) -> None:
    if response.status_code < 400:
        return
    sent = _strings([case.path_parameters, case.query, case.headers, case.body])
    body = response.content.decode(errors="replace")
    for value in sent:
        for start in range(0, max(0, len(value) - WINDOW) + 1, STRIDE):
            window = value[start : start + WINDOW]
            if len(window) == WINDOW and window in body:
                raise AssertionError(f"the response echoes {WINDOW}+ characters of the request: {window[:40]!r}...")


def _lengthened(values: dict[str, Any] | None) -> dict[str, Any] | None:
    """Every third string value made 300+ characters long (the generator rarely draws long ones)."""
    if not values:
        return values
    return {
        key: (value * (300 // max(len(value), 1) + 1))[:400]
        if isinstance(value, str) and hash(value) % 3 == 0
        else value
        for key, value in values.items()
    }


@schemathesis.hook
def map_path_parameters(ctx: Any, path_parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    return _lengthened(path_parameters)


@schemathesis.hook
def map_query(ctx: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    return _lengthened(query)
