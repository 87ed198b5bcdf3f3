"""Code interpreter: Jupyter kernels in a sandbox, behind the E2B code-interpreter HTTP API of ``server.py``.

``server.py`` runs inside the sandbox (standard library plus ``jupyter_client``, which the ``code-interpreter``
image has); the daemon and templates start it with :func:`bootstrap`, so it need not be in the image.
"""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

PORT = 49999  # server.PORT (server.py imports jupyter_client, which the host need not have)
SERVER_NAME = "stasis-kernels"  # the background process's name in the sandbox
IMAGE = "code-interpreter"
E2B_TEMPLATE = "code-interpreter-v1"  # what E2B's code-interpreter SDKs ask for


def bootstrap() -> list[str]:
    """argv that starts the server in a sandbox: its source travels in the command (compressed)."""
    source = (Path(__file__).parent / "server.py").read_bytes()
    packed = base64.b64encode(zlib.compress(source, 9)).decode()
    program = f"import base64,zlib;exec(compile(zlib.decompress(base64.b64decode('{packed}')),'stasis-kernels','exec'))"
    return ["python3", "-c", program]


__all__ = ["E2B_TEMPLATE", "IMAGE", "PORT", "SERVER_NAME", "bootstrap"]
