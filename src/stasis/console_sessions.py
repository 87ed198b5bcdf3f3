"""Console logins: a token (the daemon's, or a team's key) typed into the login form becomes a cookie session.

The cookie is HttpOnly and SameSite=Strict; every action also carries the session's CSRF token in a
header (the page reads it from a meta tag). A session is signed, not stored: its id names its expiry and is
an HMAC under the daemon's session key, its CSRF token an HMAC of the id. A daemon with a TCP token keys
sessions by it, so every node of a fleet (one token) accepts the same login and a restart keeps it; one on the
Unix socket alone keys them per run (a restarted daemon asks for the token again). A logout is remembered
until the session would have expired. A session made with a team's key names the key's id (signed with the rest),
never the key; the console asks the teams' room on each page whether that key still works.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

COOKIE = "stasis_console"
LIFETIME_SECS = 12 * 3600  # of a session, and of a console-only login token
LOGIN_PREFIX = "ui."


@dataclass
class Session:
    id: str
    csrf: str
    expires_at: float
    key_id: str | None = None  # a team's key's id; None: the owner's
    principal: Any = None  # who it is now (the console sets it from ``key_id`` on each request)


@dataclass
class Sessions:
    tokens: set[str] = field(default_factory=set)  # the daemon's own token (`stasis ui`'s are signed, not kept)
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _ended: dict[str, float] = field(default_factory=dict)  # logged-out session ids -> their expiry

    def keyed_by(self, token: str) -> None:
        """Sign sessions under ``token`` (the daemon's TCP token): any daemon with it accepts them."""
        self.key = hmac.new(token.encode(), b"stasis console sessions", hashlib.sha256).digest()

    def login_token(self) -> str:
        """A console-only login token (`stasis ui`'s): signed, not stored, good for LIFETIME_SECS."""
        body = f"{int(time.time() + LIFETIME_SECS)}.{secrets.token_urlsafe(12)}"
        return f"{LOGIN_PREFIX}{body}.{self._sign('login', body)}"

    def _signed_login(self, token: str) -> bool:
        body, _, signature = token.removeprefix(LOGIN_PREFIX).rpartition(".")
        expiry = body.partition(".")[0]
        return (
            token.startswith(LOGIN_PREFIX) and token.isascii() and expiry.isdigit() and float(expiry) > time.time()
            and hmac.compare_digest(signature.encode(), self._sign("login", body).encode())
        )  # fmt: skip

    def login(self, token: str, key_id: str | None = None) -> Session | None:
        """A session for the owner's token; or, with ``key_id``, for the team's key the caller checked."""
        known = any(hmac.compare_digest(token.encode(), known.encode()) for known in self.tokens)
        if key_id is None and (not token or not (known or self._signed_login(token))):
            return None
        body = f"{int(time.time() + LIFETIME_SECS)}.{secrets.token_urlsafe(16)}"
        if key_id is not None:
            body += f".{key_id}"
        return self._session(f"{body}.{self._sign('session', body)}")

    def get(self, session_id: str | None) -> Session | None:
        if not session_id or not session_id.isascii():  # a cookie anyone set (a sandbox's port shares the host)
            return None
        body, _, signature = session_id.rpartition(".")
        expiry = body.partition(".")[0]
        if not expiry.isdigit() or not hmac.compare_digest(signature.encode(), self._sign("session", body).encode()):
            return None
        session = self._session(session_id)
        if session.expires_at < time.time() or session.id in self._ended:
            return None
        return session

    def logout(self, session_id: str | None) -> None:
        if (session := self.get(session_id)) is not None:
            now = time.time()
            self._ended = {s: t for s, t in self._ended.items() if t > now}
            self._ended[session.id] = session.expires_at

    def _session(self, session_id: str) -> Session:
        parts = session_id.split(".")  # expiry, random, [key id,] signature
        key_id = parts[2] if len(parts) == 4 else None
        return Session(session_id, self._sign("csrf", session_id)[:32], float(parts[0]), key_id)

    def _sign(self, kind: str, text: str) -> str:
        return hmac.new(self.key, f"{kind}:{text}".encode(), hashlib.sha256).hexdigest()
