"""Console sessions are signed, not stored: any daemon keyed by the same token (every node of a fleet, or this
daemon after a restart) accepts a login, and nothing else does."""

from __future__ import annotations

import time

from stasis.console_sessions import Sessions


def keyed(token: str) -> Sessions:
    sessions = Sessions(tokens={token})
    sessions.keyed_by(token)
    return sessions


def test_a_login_on_one_node_is_a_login_on_every_node_with_the_same_token() -> None:
    first, second, other = keyed("fleet-token"), keyed("fleet-token"), keyed("another-token")
    assert first.login("wrong") is None
    session = first.login("fleet-token")
    assert session is not None and session.expires_at > time.time()
    again = second.get(session.id)
    assert again is not None and again.csrf == session.csrf  # the page's CSRF token holds on every node
    assert other.get(session.id) is None


def test_a_forged_or_stretched_session_is_refused_and_a_logout_ends_it() -> None:
    sessions = keyed("fleet-token")
    session = sessions.login("fleet-token")
    assert session is not None
    expiry, nonce, signature = session.id.split(".")
    flipped = signature[:-1] + ("1" if signature.endswith("0") else "0")
    for forged in (f"{int(expiry) + 3600}.{nonce}.{signature}", f"{expiry}.{nonce}x.{signature}", f"{expiry}.{nonce}",
                   "", "x.y.z", f"{expiry}.{nonce}.{flipped}"):  # fmt: skip
        assert sessions.get(forged) is None, forged
    sessions.logout(session.id)
    assert sessions.get(session.id) is None


def test_without_a_token_sessions_are_this_runs_alone() -> None:
    one, two = Sessions(tokens={"t"}), Sessions(tokens={"t"})
    session = one.login("t")
    assert session is not None and one.get(session.id) is not None and two.get(session.id) is None


def test_a_console_only_login_token_is_signed_lasts_its_day_and_is_never_a_session() -> None:
    door, node = keyed("fleet-token"), keyed("fleet-token")
    token = door.login_token()
    assert door.tokens == {"fleet-token"}  # nothing kept: a thousand `stasis ui` calls grow nothing
    assert door.login(token) is not None and node.login(token) is not None  # any node keyed alike takes it
    assert keyed("another-token").login(token) is None
    prefix, expiry, nonce, signature = token.split(".")
    for forged in (f"{prefix}.{int(expiry) + 3600}.{nonce}.{signature}", f"{prefix}.{expiry}.{nonce}x.{signature}",
                   f"{prefix}.{int(time.time()) - 1}.{nonce}.{signature}", token[:-1], "ui.", "ui.x.y.z"):  # fmt: skip
        assert door.login(forged) is None, forged
    session = door.login(token)
    assert session is not None and door.login(session.id) is None  # a session id is no login token
