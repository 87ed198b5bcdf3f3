"""Where a team's sandbox may start from, in process on the fake backend: the owner's templates (each sandbox the
team's own), its own checkpoints, never another team's; a template is not a team's to make."""

from __future__ import annotations

import httpx
import pytest

from stasis.daemon.core.service import SandboxService
from tests.fastkit import over_tcp

pytestmark = pytest.mark.fast
TOKEN = "team-sources-token"


def test_a_team_starts_from_the_owners_templates_and_its_own_checkpoints_only() -> None:
    async def scenario(http: httpx.AsyncClient, service: SandboxService) -> None:
        owner = {"authorization": f"Bearer {TOKEN}"}
        keys = {}
        for team in ("red", "blue"):
            await http.post("/v1/teams", json={"name": team}, headers=owner)
            made = await http.post("/v1/keys", json={"team": team}, headers=owner)
            keys[team] = {"authorization": f"Bearer {made.json()['key']}"}
        base = (await http.post("/v1/sandboxes", json={"name": "base", "backend": "fake"}, headers=owner)).json()
        taken = await http.post(f"/v1/sandboxes/{base['id']}/checkpoints", json={"type": "memory",
                                "name": "template-web"}, headers=owner)  # fmt: skip
        assert taken.status_code == 201, taken.text

        warm = await http.post("/v1/sandboxes", json={"template": "web"}, headers=keys["red"])
        assert warm.status_code == 201, warm.text  # the owner's template starts a team's sandbox ...
        assert warm.json()["spec"]["team"] == "red"  # ... which is the team's own
        own = await http.post(f"/v1/sandboxes/{warm.json()['id']}/checkpoints", json={"type": "filesystem"},
                              headers=keys["red"])  # fmt: skip
        restored = await http.post("/v1/sandboxes", json={"snapshot_id": own.json()["id"]}, headers=keys["red"])
        assert restored.status_code == 201 and restored.json()["spec"]["team"] == "red"
        theirs = await http.post("/v1/sandboxes", json={"snapshot_id": own.json()["id"]}, headers=keys["blue"])
        assert theirs.status_code == 404  # another team's checkpoint: not found
        planted = await http.post(f"/v1/sandboxes/{warm.json()['id']}/checkpoints", json={"type": "memory",
                                  "name": "template-mine"}, headers=keys["red"])  # fmt: skip
        assert planted.status_code == 403 and "owner's templates" in planted.text

    over_tcp("team-sources", TOKEN, scenario)
