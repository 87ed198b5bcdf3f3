"""A fleet of stasis hosts on Ray: one daemon per node, run by a host agent (a Ray actor pinned to its node),
and one front door (:mod:`.door`) that places, routes and lists sandboxes across them, speaking the daemon's
own API. Ray is the engine (placement of agents, liveness, a host's loss); stasis schedules nothing itself.

Ray is imported only here and only when a fleet is used: one host with no Ray stays the default.
"""
