"""The E2B face's credentials: the API key (a stasis token), and each sandbox's two tokens: its envd access
token (envd: processes and files, and its ports) and its traffic access token (its ports other than envd's,
nothing else: what a preview URL's user is given)."""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from ....e2b_wire import derived_token
from ....fsutil import atomic_write

KEY_FILE = "e2b-api-key"


class E2bKeys:
    """The API key is the daemon's TCP token when it has one, else a key of its own kept 0600 in its home.
    A sandbox's tokens are derived from it (HMACs of the sandbox id, one per kind): nothing to store, and a
    new key revokes every token."""

    def __init__(self, home: Path, token: str | None = None) -> None:
        self._path = home / KEY_FILE
        self._token = token

    @property
    def api_key(self) -> str:
        if self._token:
            return self._token
        try:
            self._token = self._path.read_text().strip()  # read once: every sandbox token is derived from it
        except FileNotFoundError:
            self._token = "e2b_" + secrets.token_hex(20)
            atomic_write(self._path, self._token.encode(), mode=0o600)
        return self._token

    def valid_api_key(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.api_key.encode())

    def _derived(self, kind: str, sandbox_id: str) -> str:
        return derived_token(self.api_key, kind, sandbox_id)

    def envd_token(self, sandbox_id: str) -> str:
        return self._derived("envd", sandbox_id)

    def traffic_token(self, sandbox_id: str) -> str:
        return self._derived("traffic", sandbox_id)

    def valid_envd_token(self, sandbox_id: str, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.envd_token(sandbox_id).encode())

    def volume_token(self, volume: str, incarnation: str) -> str:
        """A volume's content token (E2B's ``Volume.token``): derived from the API key and this volume's
        incarnation, so nothing is stored, a new key revokes it, and it never opens a later volume of its name."""
        return self._derived("volume", f"{volume}:{incarnation}")

    def valid_volume_token(self, volume: str, incarnation: str, presented: str | None) -> bool:
        expected = self.volume_token(volume, incarnation).encode()
        return presented is not None and hmac.compare_digest(presented.encode(), expected)

    def valid_traffic_token(self, sandbox_id: str, presented: str | None) -> bool:
        expected = self.traffic_token(sandbox_id).encode()
        return presented is not None and hmac.compare_digest(presented.encode(), expected)
