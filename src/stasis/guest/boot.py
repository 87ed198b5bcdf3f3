"""Starts the guest agent: ``python3 -I -S -u /opt/stasis/boot.py`` is every sandbox's init.

It imports the directory it lives in as a package (``/opt/stasis`` becomes ``stasis``),
so the agent's modules import each other relatively, as they do on the host where the
same files are ``stasis.guest``. Standard library only.
"""

import importlib
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(here))
importlib.import_module(os.path.basename(here) + ".agent").main()
