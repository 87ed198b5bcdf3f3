"""``Secret``: credentials a sandbox uses without ever holding them.

    Secret.add("GITHUB_TOKEN", token, hosts=["api.github.com"])
    sbx = Sandbox.create(network=True, secrets=["GITHUB_TOKEN"])
    sbx.run(["sh", "-c", 'curl -H "Authorization: Bearer $GITHUB_TOKEN" https://api.github.com/user'])

Inside, ``$GITHUB_TOKEN`` is a placeholder; the daemon's egress proxy puts the real value into HTTPS requests
to the secret's hosts, and nowhere else. No read returns a value.
"""

from __future__ import annotations

from ..credentials.models import SecretInfo, SecretRequest
from ..errors import InvalidRequest
from ..models import build
from ..secretnames import validate_secret_name
from ._base import Call, _model, _models
from ._client import Client


class Secret:
    @staticmethod
    def add(
        name: str,
        value: str,
        *,
        hosts: list[str],
        header: str | None = None,
        format: str = "{value}",
        body: bool = False,
        client: Client | None = None,
    ) -> SecretInfo:
        """Add a secret, or rotate one (the sandboxes that use it send the new value from their next request).
        ``header``: set it on every request to the hosts, as ``format`` says (``"Bearer {value}"``); ``body``:
        replace the placeholder in request bodies too."""
        request = build(SecretRequest, value=value, hosts=hosts, header=header, format=format, body=body)
        _check_name(name)
        call = Call("PUT", f"/v1/secrets/{name}", _model(SecretInfo), json=request.model_dump())
        return (client or Client()).call(call)

    @staticmethod
    def list(client: Client | None = None) -> list[SecretInfo]:
        return (client or Client()).call(Call("GET", "/v1/secrets", _models(SecretInfo)))

    @staticmethod
    def get(name: str, client: Client | None = None) -> SecretInfo:
        return (client or Client()).call(Call("GET", f"/v1/secrets/{name}", _model(SecretInfo)))

    @staticmethod
    def remove(name: str, client: Client | None = None) -> SecretInfo:
        """Gone from the daemon; the placeholders sandboxes hold become inert."""
        return (client or Client()).call(Call("DELETE", f"/v1/secrets/{name}", _model(SecretInfo)))


def _check_name(name: str) -> None:
    try:
        validate_secret_name(name)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
