"""E2B's face as part of the daemon (`stasis serve --e2b HOST:PORT`): opened at start and kept for the daemon's
life, so a restart (systemd's, or a crash's) brings it back on the same address with the same key, and a
connected E2B client's next call succeeds. What to export is written to ``HOME/e2b-exports`` (0600)."""

from __future__ import annotations

import logging
import threading

from ....e2b_models import E2bServeRequest
from ....fsutil import atomic_write
from ....paths import Paths
from ..deps import Rooms
from .room import Defaults

log = logging.getLogger(__name__)
EXPORTS_FILE = "e2b-exports"
TEMPLATE_BUILD_IDLE = 900  # seconds: the template's making sandbox, left by a stop that cut the making off, ends


async def serve_e2b(rooms: Rooms, paths: Paths, request: E2bServeRequest) -> None:
    defaults = Defaults(request.backend, request.memory_mb, request.cpus, request.build_network)
    listener = await rooms.e2b_listeners.open(request.listen, defaults, request.domain)
    exports = {**listener.exports, "E2B_API_KEY": rooms.e2b.keys.api_key}
    text = "".join(f"export {name}={value}\n" for name, value in exports.items())
    if listener.domain:
        text += f"# get_host(port) is PORT-SANDBOXID.{listener.domain}\n"
    atomic_write(paths.home / EXPORTS_FILE, text.encode(), mode=0o600)
    log.info("E2B's face on %s for the daemon's life; its exports in %s", listener.url, paths.home / EXPORTS_FILE)
    # a thread of its own: a build takes minutes, and must never hold the daemon's stop
    threading.Thread(target=_images, args=(paths, request.backend), name="e2b-images", daemon=True).start()


def _images(paths: Paths, backend: str) -> None:
    """E2B's templates' images and code-interpreter-v1's warm template, made once (as `stasis e2b serve` makes
    them) through the daemon's own socket, which answers once the daemon has started: until then a create of
    one of them fails saying it is missing, and code-interpreter-v1 starts from its image. The sandbox the
    template is made in ends itself when idle, should a daemon's stop cut the making off."""
    from ....sdk import Client
    from ....sdk.e2b import base_image, code_template

    try:
        with Client(paths=paths) as client:
            base_image(client)
            code_template(backend, client, timeout_secs=TEMPLATE_BUILD_IDLE, on_idle="terminate")
        log.info("E2B's templates' images and code-interpreter-v1's warm template are ready (%s)", backend)
    except Exception as exc:  # logged: the face still serves every other template
        log.warning("E2B's templates could not all be made: %s", exc)
