"""Console logins: a token typed into the login form becomes a cookie session.

The cookie is HttpOnly and SameSite=Strict; every action also carries the session's CSRF token in a
header (the page reads it from a meta tag). Sessions live in the daemon's memory: a restarted daemon
asks for the token again.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

COOKIE = "stasis_console"
LIFETIME_SECS = 12 * 3600


@dataclass
class Session:
    id: str
    csrf: str
    expires_at: float


class Sessions:
    def __init__(self) -> None:
        self.tokens: set[str] = set()  # the daemon's token, and those `stasis ui` registered
        self._sessions: dict[str, Session] = {}

    def login(self, token: str) -> Session | None:
        if not token or not any(hmac.compare_digest(token.encode(), known.encode()) for known in self.tokens):
            return None
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(24), time.time() + LIFETIME_SECS)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        session = self._sessions.get(session_id or "")
        if session is None:
            return None
        if session.expires_at < time.time():
            del self._sessions[session.id]
            return None
        return session

    def logout(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)
