"""The image layer reaches drivers through the driver table (csrc/driver.h)
only: a new protocol, format or container (a tar archive's members today)
is its driver and a line in csrc/registry.c, never an edit of the image
layer."""
import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_LAYER = ["image.c", "image_io.c", "extent_cache.c"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read(name):
    with open(os.path.join(REPO, "csrc", name)) as f:
        return f.read()


@pytest.mark.parametrize("name", IMAGE_LAYER)
def test_image_layer_includes_no_driver_header(name):
    assert [h for h in INCLUDE.findall(read(name)) if h.startswith("drivers/")] == []


@pytest.mark.parametrize("name", IMAGE_LAYER)
def test_image_layer_names_no_driver_function(name):
    """What a driver exports beyond its table (ic_tar_*, ic_file_*, ...) is
    for its own files and the registry."""
    exported = set()
    for source in glob.glob(os.path.join(REPO, "csrc", "drivers", "*.c")):
        with open(source) as f:
            exported |= set(re.findall(r"^(?!static)[a-z][^;(\n]*\b(ic_[a-z0-9_]+)\(", f.read(),
                                       re.M))
    assert "ic_tar_find" in exported, "the check would be empty"
    code = read(name)
    assert sorted(n for n in exported if re.search(r"\b%s\b" % n, code)) == []


def test_the_registry_names_the_container():
    """Which driver opens members of a probed format is the registry's word."""
    assert re.search(r'\{"tar",\s*&ic_protocol_tar_member\}', read("registry.c"))
    assert "ic_protocol_tar_member" not in read("image.c")
