"""Error messages say each thing once, in the caller's own spelling: Python
options from the API, flags from the command line; sizes take the CLI's
strings in the API too; convert() documents what it takes and raises."""
import inspect
import os
import re
import subprocess

import pytest

import imgcopy
from imgcopy.errors import ImageFormatError, Remedy

from .convert_helpers import imgcopy_cmd
from .gen.sparse import make_sparse
from .oracles import qemu_img
from .units import MiB


def cli(*args):
    return subprocess.run(imgcopy_cmd() + list(args), capture_output=True, text=True)


def dirty_qcow2(tmp_path):
    path = str(tmp_path / "dirty.qcow2")
    qemu_img("create", "-f", "qcow2", path, str(MiB))
    with open(path, "r+b") as f:  # incompatible feature bit 0: dirty
        f.seek(72)
        f.write((1).to_bytes(8, "big"))
    return path


def test_unusable_backing_file_is_said_once(tmp_path):
    fifo = str(tmp_path / "base.fifo")
    os.mkfifo(fifo)
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-u", "-b", "base.fifo", "-F", "raw", top, str(MiB))
    with pytest.raises(imgcopy.ImageFormatError) as info:
        imgcopy.open(top)
    text = str(info.value)
    assert text.count("unusable backing file") == 1, text
    assert text.count(fifo) == 1, text
    assert text.startswith(top + ": "), text
    assert "not a regular file or block device" in text


def test_directory_is_named_once(tmp_path):
    with pytest.raises(IsADirectoryError) as info:
        imgcopy.open(str(tmp_path))
    assert str(info.value).lower().count("is a directory") == 1, str(info.value)
    p = cli("map", str(tmp_path))
    assert p.returncode == 1
    assert p.stderr.lower().count("is a directory") == 1, p.stderr


def test_dirty_image_hint_python_and_cli(tmp_path):
    path = dirty_qcow2(tmp_path)
    with pytest.raises(imgcopy.ImageFormatError) as info:
        imgcopy.open(path)
    assert "force=True" in str(info.value)
    assert info.value.remedies and info.value.remedies[0].options == {"force": True}
    with imgcopy.open(path, force=True) as img:
        assert img.size == MiB
    for command in (["map", path], ["convert", path, str(tmp_path / "out.raw")]):
        p = cli(*command)
        assert p.returncode == 1
        assert "--force" in p.stderr and "force=True" not in p.stderr, p.stderr
        assert not os.path.exists(tmp_path / "out.raw")
        p = cli(*command[:1], "--force", *command[1:])
        assert p.returncode == 0, p.stderr
    # read-write, force does not help: no hint
    with pytest.raises(imgcopy.ImageFormatError) as info:
        imgcopy.open(path, mode="r+")
    assert "force" not in str(info.value)


def test_unsupported_source_names_src_format(tmp_path):
    src = str(tmp_path / "disk.qed")
    qemu_img("create", "-f", "qed", src, str(MiB))
    with pytest.raises(imgcopy.ImageFormatError) as info:
        imgcopy.convert(src, str(tmp_path / "out.raw"))
    assert 'src_format="raw"' in str(info.value)
    p = cli("convert", src, str(tmp_path / "out.raw"))
    assert p.returncode == 1 and "-f raw" in p.stderr and "format=" not in p.stderr


def test_unsupported_backing_file_has_no_hint(tmp_path):
    """The overlay names the backing file's format: no caller option helps."""
    base = str(tmp_path / "base.qed")
    qemu_img("create", "-f", "qed", base, str(MiB))
    top = str(tmp_path / "top.qcow2")
    qemu_img("create", "-f", "qcow2", "-u", "-b", "base.qed", "-F", "raw", top, str(MiB))
    with open(top, "r+b") as f:  # hide the backing format: the backing file is probed
        data = f.read(65536)
        f.seek(data.index(b"\xe2\x79\x2a\xca"))  # its extension becomes an unknown one
        f.write(b"\x12\x34\x56\x78")
    with pytest.raises(imgcopy.ImageFormatError) as info:
        imgcopy.open(top)
    assert "qed" in str(info.value) and "format=" not in str(info.value), str(info.value)


def test_unknown_convert_flag_prints_convert_usage():
    p = cli("convert", "--no-such-flag", "a", "b")
    assert p.returncode == 2
    assert p.stderr.startswith("usage: imgcopy convert"), p.stderr
    assert "--no-such-flag" in p.stderr


def test_remedies_spelling():
    exc = ImageFormatError("bad", "x.img", [Remedy({"format": "raw"}, "to read it as raw"),
                                            Remedy({"force": True}, "to force it")])
    assert str(exc) == 'x.img: bad (pass format="raw" to read it as raw, or force=True to force it)'
    from imgcopy.cli import cli_spelling
    assert exc.describe(cli_spelling) == "x.img: bad (pass -f raw to read it as raw, or --force to force it)"
    import pickle
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == str(exc) and again.filename == "x.img"


# ---------------------------------------------------------------------------
# sizes as strings

def test_sizes_take_strings(tmp_path):
    src = str(tmp_path / "src.raw")
    chunks = [(k * MiB, bytes([k + 1]) * 65536 + bytes(8192) + bytes([k + 2]) * 4096)
              for k in range(8)]
    make_sparse(src, 8 * MiB, chunks)
    a = imgcopy.convert(src, str(tmp_path / "a.raw"), sparse_threshold="8k", request_size="1M")
    b = imgcopy.convert(src, str(tmp_path / "b.raw"), sparse_threshold=8192,
                        request_size=1 << 20)
    keys = ("bytes_written", "bytes_skipped", "write_requests", "zero_requests")
    assert [getattr(a, k) for k in keys] == [getattr(b, k) for k in keys]
    assert a.options.sparse_threshold == 8192 and a.options.request_size == MiB
    c = imgcopy.convert(src, str(tmp_path / "c.qcow2"), dst_format="qcow2", cluster_size="4k")
    assert c.bytes_written
    assert imgcopy.info(str(tmp_path / "c.qcow2")).cluster_size == 4096
    p1 = imgcopy.plan(src, sparse_threshold="8k", request_size="1M")
    assert p1.totals() == imgcopy.plan(src, sparse_threshold=8192, request_size=MiB).totals()


@pytest.mark.parametrize("value, error", [("64q", ValueError), ("-4k", ValueError),
                                          ("1.0001k", ValueError), (True, TypeError),
                                          (4.0, TypeError)])
def test_bad_sizes_name_the_option(tmp_path, value, error):
    src = str(tmp_path / "src.raw")
    make_sparse(src, MiB)
    with pytest.raises(error, match="sparse_threshold"):
        imgcopy.convert(src, str(tmp_path / "out.raw"), sparse_threshold=value)
    assert not os.path.exists(tmp_path / "out.raw")


def test_convert_documents_every_parameter():
    doc = inspect.getdoc(imgcopy.convert)
    for name in inspect.signature(imgcopy.convert).parameters:
        assert re.search(r"``%s``" % name, doc), "convert() does not document %s" % name
    assert "Returns" in doc and "CopyResult" in doc
    for exc in ("ImageFormatError", "ValueError", "OSError", "KeyboardInterrupt"):
        assert exc in doc
