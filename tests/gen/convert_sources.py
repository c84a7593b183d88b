"""The read-only raw sources of the convert tests, by name: seeded images
of tests/gen/raw_kinds.py plus custom layouts, each built once per session
(conftest's ``convert_sources``) with its qemu-img map layout taken before
anybody reads it.
"""

import os
from typing import Dict

from ..oracles import Layout, require_qemu_io, source_layout
from .raw_kinds import GenImage, make_image
from .raw_layouts import odd_1000001

# Seeded images for the option matrix: (name, kind, seed) built by
# tests/gen/raw_kinds.py, plus custom layouts.  Kinds whose map is not
# stable under reads (fallocated / qemu-io unwritten extents on ext4) are
# used for content only.
MATRIX_IMAGES = (
    ("holes_and_data", "holes_and_data", 3),
    ("alloc_zeros", "alloc_zeros", 5),
    ("small_extents", "small_extents", 2),
    ("unaligned", "unaligned", 7),
    ("odd_1000001", "custom", 1),
    ("empty", "empty", 0),
    ("last_byte", "last_byte", 4),
    ("all_data", "all_data", 9),
    ("tiny", "tiny", 6),
    ("qemu_io", "qemu_io", 8),
)
# Images used by single tests only.
EXTRA_IMAGES = (
    ("all_hole", "all_hole", 3),
)
ALL_IMAGES = MATRIX_IMAGES + EXTRA_IMAGES
UNSTABLE_MAP_KINDS = ("qemu_io", "fallocated")


def build_image(path, kind, seed) -> int:
    if kind == "custom":
        return odd_1000001(path, seed)
    return make_image(path, kind, seed)


class SourceSet:
    """Session-wide read-only sources and their layouts."""

    def __init__(self, root):
        self.root = root
        self._img: Dict[str, GenImage] = {}
        self._layout: Dict[str, Layout] = {}

    def get(self, name) -> GenImage:
        if name not in self._img:
            (kind, seed), = [(k, s) for (n, k, s) in ALL_IMAGES if n == name]
            if kind == "qemu_io":
                require_qemu_io()
            path = os.path.join(str(self.root), "%s.img" % name)
            size = build_image(path, kind, seed)
            self._img[name] = GenImage(path, size, kind, seed)
            # the layout, taken once before anybody reads the image
            self._layout[name] = source_layout(path)
        return self._img[name]

    def layout(self, name) -> Layout:
        self.get(name)
        return self._layout[name]
