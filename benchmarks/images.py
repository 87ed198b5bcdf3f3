"""Images beside the raw primitives: importing, a cached rebuild, starting warm from a template.

    .venv/bin/python benchmarks/images.py [--rounds N]

- import: `ImageStore.import_image` of an oci-archive (a 60 MB python image made here, offline)
  beside `skopeo copy` + `umoci unpack` of the same archive by hand.
- build: a 4-step Dockerfile on the default image with its last step changed (one step runs: a
  build sandbox, the step, a FILESYSTEM checkpoint, the commit), then rebuilt with every step cached.
- first answer: `Sandbox.create(template=...)` until its HTTP server answers, beside creating from
  the plain image, starting the same server and waiting until it answers.

Prints medians and ratios; writes benchmarks/results/images.json.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test images live with the tests

from common import Comparison, report_ratios, serving_daemon, timed

from stasis import Client, Image, Sandbox, Template
from stasis.images import ImageStore
from stasis.images.layers import link_tree
from stasis.images.recipe import RECIPES
from stasis.paths import default_home
from tests.images.ociimages import archive, oci_layout, python_rootfs
from tests.network.servers import COUNTER

READY = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), timeout=1)\""
START = f"python3 -c '{COUNTER.replace(chr(39), chr(34))}' 8000"
DOCKERFILE = "FROM default\nENV MODE=bench\nWORKDIR /srv\nRUN echo one > one.txt\nRUN echo {n} > two.txt\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, Comparison] = {}
    scratch = Path(tempfile.mkdtemp(prefix="stasis-bench-images-"))
    try:
        ref = archive(oci_layout(python_rootfs(scratch / "rootfs"), scratch / "layout", "v1", env={"A": "1"}),
                      "oci-archive", scratch / "app.tar")  # fmt: skip
        images = scratch / "images"
        default = default_home() / "images" / RECIPES["default"].key
        link_tree(default, images / default.name)

        def ours() -> None:
            store = ImageStore(images)
            info = store.import_image(ref, "bench")
            store.remove(info.key)

        def by_hand() -> None:
            layout, bundle = scratch / "hand-layout", scratch / "hand-bundle"
            subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", ref, f"oci:{layout}:v1"], check=True)
            subprocess.run(["umoci", "unpack", "--image", f"{layout}:v1", str(bundle)], check=True,
                           capture_output=True)  # fmt: skip
            shutil.rmtree(layout)
            shutil.rmtree(bundle)

        rows["import a 60 MB image"] = (timed(ours, args.rounds), timed(by_hand, args.rounds), "skopeo + umoci")
        with serving_daemon("stasis-bench-img-", STASIS_IMAGE_DIR=str(images)) as paths:
            client = Client(paths)
            context = scratch / "ctx"
            context.mkdir()
            builds, rebuilds = [], []
            for n in range(args.rounds):
                (context / "Dockerfile").write_text(DOCKERFILE.replace("{n}", str(n)))
                image = Image.from_dockerfile(context / "Dockerfile", context)
                builds.append(timed(lambda: image.build("bench", client=client), 1)[0])
                rebuilds.append(timed(lambda: image.build("bench", client=client), 1)[0])
            rows["Dockerfile, every step cached"] = (rebuilds, builds, "its last step changed")
            Template.create("bench", start_cmd=START, ready_cmd=READY, client=client)
            get = "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/', timeout=5).read()"

            def warm() -> None:
                sbx = Sandbox.create(template="bench", client=client)
                assert sbx.run(["python3", "-c", get]).exit_code == 0
                sbx.terminate()

            def cold() -> None:
                sbx = Sandbox.create(client=client)
                sbx.start_process(["/bin/sh", "-c", START])
                while sbx.run(["/bin/sh", "-c", READY]).exit_code != 0:
                    time.sleep(0.05)
                assert sbx.run(["python3", "-c", get]).exit_code == 0
                sbx.terminate()

            rows["create until the server answers"] = (timed(warm, args.rounds), timed(cold, args.rounds),
                                                       "plain image + start + wait")  # fmt: skip
            Template.delete("bench", client=client)
            client.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report_ratios("images (gVisor)", "images", rows, {"rounds": args.rounds})


if __name__ == "__main__":
    main()
