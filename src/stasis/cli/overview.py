"""The front page of `stasis --help`: each command in a panel, in one line, as `gh` and `docker` show theirs.
The long help (`stasis CMD --help`) stays each command's own docstring."""

from __future__ import annotations

import typer

# panel -> {command: its one line}, in the order they are shown
OVERVIEW: dict[str, dict[str, str]] = {
    "Sandboxes": {
        "create": "Create and start a sandbox (from an image, a template or a checkpoint)",
        "ls": "List sandboxes",
        "info": "Show one sandbox",
        "suspend": "Suspend to disk: memory, processes and files",
        "resume": "Resume exactly where it was",
        "fork": "Live copies that continue from now, then diverge",
        "rm": "Terminate sandboxes and delete their files",
        "df": "Disk used by sandboxes, checkpoints and images",
    },
    "Commands and files": {
        "run": "Run a command like `ssh host cmd`",
        "start": "Start a named background process",
        "ps": "Processes started through stasis",
        "logs": "Output of a background process",
        "kill": "Signal a background process and its children",
        "shell": "A tmux session in the sandbox (Ctrl-\\ detaches)",
        "cp": "Copy files or directories in or out, like `docker cp`",
        "code": "Run code in a Jupyter kernel that keeps its variables",
    },
    "Checkpoints and moves": {
        "checkpoint": "Checkpoint a sandbox; it keeps running (list them: `checkpoints`)",
        "push": "Send a sandbox or checkpoint to the remote store",
        "pull": "Take a sandbox or checkpoint from the remote store",
        "remote": "What the remote store holds",
        "fleet": "Many hosts as one, on Ray (a local cluster, its nodes)",
    },
    "Network and access": {
        "network": "Show or change the egress policy, live",
        "egress": "Every connection a sandbox opened: the egress audit",
        "secret": "Secrets the proxy adds to requests; sandboxes never hold them",
        "port": "Expose a port at a URL (a request resumes it)",
        "port-forward": "Forward a local TCP port into the sandbox",
        "ssh": "Log in with your OpenSSH client",
        "ssh-config": "The OpenSSH config for `ssh stasis-NAME`",
        "team": "Teams, quotas; also `key`, `webhook`, `usage`, `audit`",
    },
    "The daemon, environments and other faces": {
        "image": "Images: import, build, list, remove",
        "template": "Templates that start warm",
        "volume": "Volumes: files that outlive sandboxes; snapshots and forks",
        "pool": "Warm pools handed out by `stasis create`",
        "serve": "Run the daemon in the foreground",
        "daemon": "Whether it runs; stop, restart",
        "doctor": "Which backends work here, and why",
        "agent": "The agent harness: a tool-calling loop in a sandbox",
        "mcp": "The MCP tools over stdio",
        "e2b": "E2B's API, for the official E2B SDKs",
        "desktop": "A desktop sandbox: screenshot, click, type, open",
        "ui": "The web console",
    },
}


def apply(app: typer.Typer) -> None:
    """Give every registered command and group its panel and its one line; a command left out is an error."""
    lines = {name: (panel, line) for panel, commands in OVERVIEW.items() for name, line in commands.items()}
    for info in [*app.registered_commands, *app.registered_groups]:
        name = info.name or (info.callback.__name__ if info.callback else "")
        if getattr(info, "hidden", False):
            continue
        panel, line = lines.pop(name) if name in lines else (None, None)
        if panel is None:
            raise RuntimeError(f"`stasis {name}` has no line in cli/overview.py: add it to OVERVIEW")
        info.rich_help_panel = panel
        info.short_help = line
    if lines:
        raise RuntimeError(f"cli/overview.py names commands that do not exist: {sorted(lines)}")
