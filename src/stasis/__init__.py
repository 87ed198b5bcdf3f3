"""stasis: stateful sandboxes for AI agents.

Every sandbox has its own kernel and can be suspended with its memory, running
processes and files, and resumed later exactly where it was::

    from stasis import Sandbox

    sbx = Sandbox.create(name="work")
    sbx.run("python3 -c 'print(1 + 1)'").stdout   # '2\\n'
    sbx.suspend(); sbx.resume()
"""

__version__ = "0.1.0"

from .sdk import *  # noqa: F403
from .sdk import __all__ as _sdk_all

__all__ = ["__version__", *_sdk_all]
