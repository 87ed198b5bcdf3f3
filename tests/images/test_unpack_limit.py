"""An image may unpack only in proportion to what its layers weigh: a small archive that inflates to
hundreds of MB (a decompression bomb) is stopped with a message that says why and how to allow it.
No daemon: the layout and the unpack, as an import runs them (umoci, as `make setup` installs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stasis.errors import InvalidRequest
from stasis.images.oci import UNPACK_FLOOR, OciLayout, image_size_limit
from tests.images.ociimages import oci_layout


def test_the_default_limit_is_proportionate_to_the_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STASIS_IMAGE_MAX_MB", raising=False)
    assert image_size_limit(6 << 20) == UNPACK_FLOOR  # 6 MB of layers: never 6 GB
    assert image_size_limit(100 << 20) == 2000 << 20
    assert image_size_limit(10 << 30) == 16 << 30
    monkeypatch.setenv("STASIS_IMAGE_MAX_MB", "64")
    assert image_size_limit(6 << 20) == 64 << 20  # the operator's word wins


def test_a_small_layer_that_inflates_is_stopped_and_a_plain_one_unpacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STASIS_IMAGE_MAX_MB", raising=False)
    bomb = tmp_path / "bomb"
    (bomb / "etc").mkdir(parents=True)
    with open(bomb / "zeros", "wb") as f:  # well under a MB once compressed
        for _ in range((UNPACK_FLOOR >> 20) + 64):
            f.write(bytes(1 << 20))
    oci_layout(bomb, tmp_path / "layout", "bomb", env={})
    plain = tmp_path / "plain"
    (plain / "etc").mkdir(parents=True)
    (plain / "etc/hostname").write_text("plain\n")
    oci_layout(plain, tmp_path / "layout", "plain", env={})
    layout = OciLayout(tmp_path / "layout")
    assert layout.layer_bytes("bomb") < 4 << 20
    with pytest.raises(InvalidRequest, match=r"decompression bomb(.|\n)*times its layers(.|\n)*STASIS_IMAGE_MAX_MB"):
        layout.unpack("bomb", tmp_path / "unpacked-bomb")
    rootfs = layout.unpack("plain", tmp_path / "unpacked-plain")
    assert (rootfs / "etc/hostname").read_text() == "plain\n"
