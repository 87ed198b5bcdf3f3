"""The E2B face: E2B's control-plane API and envd (Connect RPC and HTTP), so that the official E2B SDKs run
unchanged against stasis.

    app          one listener: a request naming a sandbox (E2b-Sandbox-Id, or the Host ``PORT-ID.domain``) goes to
                 envd or that sandbox's port; any other to the control plane
    control      the control plane's app (key check, E2B's errors); its routes: sandbox_routes, snapshot_routes;
                 plane: their bodies and answers
    process      process.Process (commands, PTYs) over the guest agent
    filesystem   filesystem.Filesystem, and envd's HTTP /files and /health
    room         what E2B adds to a stasis sandbox: metadata, envs, a lifetime (killed or paused when it ends)
    listener     the TCP listener `stasis e2b serve` opens inside the daemon, and closes when it exits

A room above the core, like the others: every call takes the same locks, journal and auto-resume as
stasis' own API. E2B sandbox ids are stasis sandbox ids.
"""
