"""Teams and their keys through the daemon (the owner's; a key with the admin scope manages its team's keys).

create_team("research", max_running=4, client=c)
key = create_key("research", ["write", "exec"], expires_in_secs=30 * 86400, client=c).key  # shown once
Client(url=..., token=key)                                  # that team's sandboxes, checkpoints and volumes
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..models import build
from ..team_models import CreatedKey, CreateKeyRequest, CreateTeamRequest, KeyInfo, TeamInfo, TeamQuotas, UsageReport
from ._base import Call, _model, _models
from ._client import Client


def create_team(name: str, *, client: Client, **quotas: Any) -> TeamInfo:
    body = build(CreateTeamRequest, name=name, quotas=build(TeamQuotas, **quotas)).model_dump(mode="json")
    return client.call(Call("POST", "/v1/teams", _model(TeamInfo), json=body))  # type: ignore[no-any-return]


def list_teams(*, client: Client) -> list[TeamInfo]:
    return client.call(Call("GET", "/v1/teams", _models(TeamInfo)))  # type: ignore[no-any-return]


def set_quotas(name: str, *, client: Client, **quotas: Any) -> TeamInfo:
    """The quotas given set (None: no limit); the others kept."""
    body = build(TeamQuotas, **quotas).model_dump(mode="json", exclude_unset=True)
    return client.call(Call("PATCH", f"/v1/teams/{quote(name)}", _model(TeamInfo), json=body))  # type: ignore[no-any-return]


def remove_team(name: str, *, client: Client) -> None:
    client.call(Call("DELETE", f"/v1/teams/{quote(name)}", lambda r: None))


def create_key(
    team: str, scopes: list[str], *, client: Client, expires_in_secs: int | None = None, description: str = ""
) -> CreatedKey:
    body = build(CreateKeyRequest, team=team, scopes=scopes, expires_in_secs=expires_in_secs,
                 description=description).model_dump(mode="json")  # fmt: skip
    return client.call(Call("POST", "/v1/keys", _model(CreatedKey), json=body))  # type: ignore[no-any-return]


def list_keys(*, client: Client, team: str | None = None) -> list[KeyInfo]:
    params = {"team": team} if team else {}
    return client.call(Call("GET", "/v1/keys", _models(KeyInfo), params=params))  # type: ignore[no-any-return]


def revoke_key(key_id: str, *, client: Client) -> KeyInfo:
    return client.call(Call("DELETE", f"/v1/keys/{quote(key_id)}", _model(KeyInfo)))  # type: ignore[no-any-return]


def whoami(*, client: Client) -> dict[str, Any]:
    return client.call(Call("GET", "/v1/whoami", lambda r: r.json()))  # type: ignore[no-any-return]


def usage(*, client: Client, team: str | None = None, since: float | None = None) -> UsageReport:
    """Per sandbox and per team since ``since`` (default: a day ago); a team's key sees its own team's."""
    params: dict[str, Any] = {k: v for k, v in (("team", team), ("since", since)) if v is not None}
    return client.call(Call("GET", "/v1/usage", _model(UsageReport), params=params))  # type: ignore[no-any-return]


def audit(*, client: Client, after: int = 0, team: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """The audit log past entry ``after``: who did what to which resource, when, from where, with what result."""
    params: dict[str, Any] = {"after": after, "limit": limit, **({"team": team} if team else {})}
    return client.call(Call("GET", "/v1/audit", lambda r: r.json(), params=params))  # type: ignore[no-any-return]
