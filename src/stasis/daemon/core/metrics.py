"""Prometheus metrics of one daemon (its own registry: no global state)."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ...models import SandboxInfo, SandboxStatus

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sandboxes = Gauge("stasis_sandboxes", "Sandboxes by state", ["state"], registry=r)
        self.team_sandboxes = Gauge(
            "stasis_team_sandboxes", "Sandboxes by team and state (team '': the owner's)", ["team", "state"], registry=r
        )
        self.create_seconds = Histogram("stasis_create_seconds", "Create latency", buckets=LATENCY_BUCKETS, registry=r)
        self.suspend_seconds = Histogram(
            "stasis_suspend_seconds", "Suspend latency", buckets=LATENCY_BUCKETS, registry=r
        )
        self.resume_seconds = Histogram("stasis_resume_seconds", "Resume latency", buckets=LATENCY_BUCKETS, registry=r)
        self.checkpoint_seconds = Histogram(
            "stasis_checkpoint_seconds", "Checkpoint latency", buckets=LATENCY_BUCKETS, registry=r
        )
        self.idle_actions = Counter("stasis_idle_actions", "Idle suspends and terminations", ["action"], registry=r)
        self.idle_failures = Counter(
            "stasis_idle_failures", "Idle actions that failed (sandbox kept running)", registry=r
        )
        self.auto_resumes = Counter("stasis_auto_resumes", "Resumes triggered by a request", registry=r)
        self.pool_claims = Counter("stasis_pool_claims", "Creates answered from a warm pool", registry=r)

    def render(self, sandboxes: list[SandboxInfo]) -> bytes:
        counts = Tally(info.status for info in sandboxes)
        for state in SandboxStatus:
            self.sandboxes.labels(state.value).set(counts.get(state, 0))
        self.team_sandboxes.clear()  # a team with none left is not shown as one with stale counts
        by_team = Tally(
            (info.spec.team or "", info.status) for info in sandboxes if info.status != SandboxStatus.TERMINATED
        )
        for (team, state), count in by_team.items():
            self.team_sandboxes.labels(team, state.value).set(count)
        return generate_latest(self.registry)
