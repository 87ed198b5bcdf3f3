"""The fleet's front door holds no body past its route's bound: a large declared body is refused before a byte of it
is read, one sent in chunks once it passes the bound, a team's key or the owner's token alike (a 300 MiB
`POST /v1/keys` took the door from 219 to 1,625 MB). In process, before any route reaches a node: no Ray here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from stasis.body_limits import MAX_JSON_BODY
from stasis.fleet.door import create_door
from stasis.fleet.nodes import Nodes

pytestmark = pytest.mark.fast

TOKEN = "the-fleets-token"
A_KEY = "Bearer sk_stasis_aaaaaaaaaaaa_" + "0" * 48
MIB = 1 << 20


def test_a_body_past_its_bound_is_refused_before_the_door_holds_it() -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(64):
            sent += 1
            yield b"x" * MIB

    async def main() -> None:
        transport = httpx.ASGITransport(app=create_door(Nodes(TOKEN), TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://door") as door:
            for method, path, who in (("POST", "/v1/keys", A_KEY), ("GET", "/v1/sandboxes", A_KEY),
                                      ("POST", "/v1/keys", f"Bearer {TOKEN}")):  # fmt: skip
                declared = {"authorization": who, "content-length": str(300 * MIB)}
                answer = await door.request(method, path, content=b"{}", headers=declared)
                assert answer.status_code == 413 and "16 MiB" in answer.json()["message"], (method, path)
            answer = await door.post("/v1/keys", content=chunks(), headers={"authorization": f"Bearer {TOKEN}"})
            assert answer.status_code == 413
            assert sent <= MAX_JSON_BODY // MIB + 2  # read no further than the bound

    asyncio.run(main())
