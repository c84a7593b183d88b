"""NBD URIs where paths go: which names are URIs, and how qemu spells them
back (its pseudo-filenames, block/nbd.c)."""
import pytest

from imgcopy.uris import is_nbd_uri, qemu_filename


@pytest.mark.parametrize("name,uri", [
    ("nbd://host/x", True), ("nbd+unix:///?socket=/s", True), ("nbds://h:1/e", True),
    ("nbd+vsock://3", True), (b"nbd://h", True), ("null:", False), ("disk.raw", False),
    ("./nbd://x", False), ("http://h/x", False), ("nbd:/x", False),
])
def test_is_nbd_uri(name, uri):
    assert is_nbd_uri(name) is uri


@pytest.mark.parametrize("name,shown", [
    ("nbd+unix:///?socket=/tmp/s", "nbd+unix://?socket=/tmp/s"),
    ("nbd+unix:///exp?socket=/tmp/s", "nbd+unix:///exp?socket=/tmp/s"),
    ("nbd://127.0.0.1:10911", "nbd://127.0.0.1:10911"),
    ("nbd://127.0.0.1:10911/", "nbd://127.0.0.1:10911"),
    ("nbd://localhost/exp", "nbd://localhost:10809/exp"),
    ("nbd://[::1]:10809/e", "nbd://[::1]:10809/e"),  # qemu shows no pseudo-filename
    ("disk.raw", "disk.raw"),
])
def test_qemu_filename(name, shown):
    assert qemu_filename(name) == shown
