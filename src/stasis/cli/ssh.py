"""`stasis ssh`, `ssh-config`, and the two commands OpenSSH runs for `ssh stasis-NAME`."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from .. import ssh
from ..errors import InvalidRequest
from ..paths import Paths
from ..sdk import Sandbox
from ._common import Name, app, client, err


@app.command("ssh")
def ssh_into(
    name: Name,
    command: Annotated[list[str] | None, typer.Argument(help="Command instead of a login shell (after --).")] = None,
    key: Annotated[
        Path | None, typer.Option("--key", help="A public key (.pub) to authorise from now on; logs in with it.")
    ] = None,
) -> None:
    """Log in to the sandbox with your OpenSSH client (no network needed; a suspended sandbox resumes)."""
    if shutil.which("ssh") is None:
        raise InvalidRequest("no ssh client on this host; install it (apt-get install openssh-client)")
    sbx = Sandbox.connect(name, client=client())
    paths = Paths.from_env()
    argv = ["ssh", "-F", str(ssh.write_config(paths))]
    remembered = paths.home / "ssh-identities"  # keys given with --key: offered again by every later `stasis ssh`
    identities = [Path(line) for line in _lines(remembered)]
    if key is not None:
        sbx.authorize_ssh_keys(key.read_text().splitlines())
        private = (key.with_suffix("") if key.suffix == ".pub" else key).resolve()
        if private.exists() and private not in identities:
            identities.append(private)
            remembered.write_text("".join(f"{path}\n" for path in identities))
    identities = [path for path in identities if path.exists()]
    if not identities and not ssh.user_public_keys():
        raise InvalidRequest(
            "you have no SSH key to log in with: make one with `ssh-keygen -t ed25519`, or give one with "
            f"`stasis ssh {name} --key PATH.pub` (it is authorised in the sandbox and used from then on)"
        )
    for path in identities:
        argv += ["-i", str(path)]
    argv.append(ssh.HOST_PREFIX + (sbx.info().name or sbx.id))
    remote = command or []
    if remote and remote[0] == "--":
        remote = remote[1:]
    os.execvp("ssh", argv + remote)


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


@app.command("ssh-config")
def ssh_config(
    install: Annotated[bool, typer.Option("--install", help="Add the block to ~/.ssh/config (or replace it).")] = False,
) -> None:
    """Print the OpenSSH config block that makes `ssh stasis-NAME` (and scp, rsync, Remote-SSH) work."""
    if not install:
        sys.stdout.write(ssh.config_block(Paths.from_env()))  # verbatim: a console would wrap long lines
        return
    config = Path.home() / ".ssh" / "config"
    changed = ssh.install_config(Paths.from_env(), config)
    err.print(f"{'updated' if changed else 'already up to date:'} {config}; try: ssh stasis-NAME")


@app.command("ssh-proxy", hidden=True)
def ssh_proxy(host: Annotated[str, typer.Argument(help="stasis-NAME, as ssh passes it (%n).")]) -> None:
    """ssh's ProxyCommand: authorise your keys, learn the host key, then carry the connection to the sandbox."""
    paths = Paths.from_env()
    sbx = Sandbox.connect(ssh.sandbox_ref(host), client=client())
    if keys := ssh.user_public_keys():
        sbx.authorize_ssh_keys(keys)
    ssh.remember_host_key(paths, host, sbx.ssh_host_key())
    failure = ssh.proxy(paths, sbx.id)
    if failure:
        err.print(f"stasis: {failure}")
        sys.exit(255)
