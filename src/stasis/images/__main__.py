"""`python -m stasis.images RECIPE`: build a recipe's image into the image directory in place.

What `make setup` runs before any daemon exists; afterwards images are the daemon's to write
(`stasis image build` asks it). Prints progress lines; exits 1 with the reason on failure."""

from __future__ import annotations

import sys

from ..errors import StasisError
from ..paths import Paths
from .store import ImageStore


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "default"
    store = ImageStore(Paths.from_env().images)
    try:
        info = store.build(name, progress=lambda line: print(f"  {line[:120]}", file=sys.stderr, flush=True))
    except StasisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"image {info.key}: {info.size_bytes / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
