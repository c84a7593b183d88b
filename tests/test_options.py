"""Options as objects: CopyOptions and Qcow2Options are frozen, normalised
and checked by the C core when they are made, with the check the copy and
the creation make themselves (the same message wherever a bad option comes
from, before any file is touched); convert(options=...), the same options as
keywords and plan(options=...) make the same copy; the defaults are the C
core's.  qemu-img is the oracle for what was written."""
import dataclasses
import json
import os
import subprocess

from typing import Any, Dict, List, Tuple

import pytest

import imgcopy
from imgcopy import CopyOptions, Qcow2Options, _core

from .oracles import assert_same_content, require_qemu_img
from .gen.sparse import make_sparse
from .units import KiB, MiB


COUNTERS = ("bytes_read", "bytes_written", "bytes_zeroed", "bytes_skipped", "read_requests",
            "write_requests", "zero_requests", "extents")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Data with zero runs of several lengths inside it, holes between."""
    path = str(tmp_path_factory.mktemp("options") / "src.raw")
    chunks = []
    for k in range(12):
        zeros = bytes(512 << (k % 8))  # 512 B .. 64 KiB of written zeros
        chunks.append((k * MiB + k * 4096, bytes([k + 1]) * 24576 + zeros + b"\x7f" * 8192))
    make_sparse(path, 12 * MiB + 12345, chunks)
    return path


def counters(result):
    d = result.to_dict() if hasattr(result, "to_dict") else result
    return {k: d[k] for k in COUNTERS}


# each: the options, and whether plan() and a new raw file agree on them
OPTION_CASES = [
    dict(),
    dict(sparse_threshold="8k", request_size="64k"),
    dict(sparse_threshold=0, concurrency=1, out_of_order=False),
    dict(sparse_threshold="64k", concurrency=8, request_size="1M"),
    dict(sparse_threshold=512, request_size=4096, concurrency=3),
    dict(target_is_zero=False, sparse_threshold="16k"),
    dict(sparse_threshold="16M", request_size="4M", flush=False),
]


@pytest.mark.parametrize("kwargs", OPTION_CASES, ids=lambda kw: ",".join(map(str, kw.items())))
def test_options_keywords_and_plan_agree(source, tmp_path, kwargs):
    require_qemu_img()
    options = CopyOptions(**kwargs)
    by_object = imgcopy.convert(source, str(tmp_path / "object.raw"), options=options)
    by_keywords = imgcopy.convert(source, str(tmp_path / "keywords.raw"), **kwargs)
    planned = imgcopy.plan(source, options=options)
    expected = counters(planned.totals())
    if options.target_is_zero is False:
        # plan() knows nothing of a destination; the copy asks the new file,
        # whose holes read as zeros: what plan() zeroes, it skips
        expected.update(bytes_skipped=expected["bytes_skipped"] + expected["bytes_zeroed"],
                        bytes_zeroed=0, zero_requests=0)
        assert by_object.bytes_already_zero == by_object.bytes_skipped > 0
    assert counters(by_object) == counters(by_keywords) == expected
    for name in ("object.raw", "keywords.raw"):
        assert_same_content(source, str(tmp_path / name))
    # what the copy ran with: the options, "auto" decided (a new file reads
    # as zeros), requests whole blocks of the zero scan (the threshold's
    # largest power of two)
    decided = dataclasses.replace(
        options, target_is_zero=True if options.target_is_zero is None else options.target_is_zero,
        request_size=round_up(options.request_size, scan_block(options.sparse_threshold)))
    assert by_object.options == by_keywords.options == decided
    # the plan's engine writes into nothing: no flush
    assert planned.options == dataclasses.replace(decided, flush=False)


def scan_block(threshold):
    """The zero scan's blocks: the largest power of two not above the threshold (4 KiB for 0)."""
    return 4096 if threshold == 0 else 1 << (threshold.bit_length() - 1)


def round_up(n, unit):
    return -(-n // unit) * unit


def test_options_reported_for_compressed_qcow2(source, tmp_path):
    """qcow2 -c judges each cluster on its own: the threshold the copy ran
    with is the cluster size, and so says CopyResult.options."""
    res = imgcopy.convert(source, str(tmp_path / "out.qcow2"), dst_format="qcow2",
                          compress=True, cluster_size="64k", sparse_threshold="1M",
                          request_size=100 * 4096)
    assert res.options.sparse_threshold == 64 * KiB
    assert res.options.request_size == 7 * 64 * KiB  # whole clusters
    assert res.options.target_is_zero is True  # a new image


def test_the_cases_differ(source):
    """The cases above are not one copy under eight names."""
    plans = {json.dumps(imgcopy.plan(source, options=CopyOptions(**kw)).totals(),
                        sort_keys=True) for kw in OPTION_CASES}
    assert len(plans) >= 5, plans


def test_keywords_replace_the_options_fields(source, tmp_path):
    base = CopyOptions(sparse_threshold="64k", concurrency=2)
    r = imgcopy.convert(source, str(tmp_path / "out.raw"), options=base, sparse_threshold=0)
    assert r.options.sparse_threshold == 0 and r.options.concurrency == 2
    assert base.sparse_threshold == 64 * KiB  # frozen: the caller's object is unchanged
    alone = imgcopy.convert(source, str(tmp_path / "alone.raw"), sparse_threshold=0,
                            concurrency=2)
    assert counters(r) == counters(alone)
    p = imgcopy.plan(source, options=base, concurrency=5)
    assert p.options.concurrency == 5 and p.options.sparse_threshold == 64 * KiB


def test_objects_are_frozen_normalised_and_comparable():
    a = CopyOptions(sparse_threshold="64k", request_size="1M", direct=(True, True))
    b = CopyOptions(sparse_threshold=65536, request_size=MiB, direct=True)
    assert a == b and hash(a) == hash(b)
    assert a.sparse_threshold == 65536 and isinstance(a.request_size, int)
    assert a.direct is True and a.source_direct and a.destination_direct
    c = CopyOptions(direct=(False, True))
    assert c.direct == (False, True) and not c.source_direct and c.destination_direct
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(a, "concurrency", 8)
    q = Qcow2Options(cluster_size="4k", backing_file=os.path.join("a", "b.qcow2"))
    assert q.cluster_size == 4096 and q.backing_file == "a/b.qcow2"
    assert q == Qcow2Options(cluster_size=4096, backing_file="a/b.qcow2")


def test_defaults_are_the_c_cores():
    defaults = _core.copy_option_defaults()
    o = CopyOptions()
    assert o.engine_options() == {**defaults, "target_is_zero": None}
    for name, value in defaults.items():
        # None: decided by the server (connections: 0); seconds for the core's ms
        expected = (None if name == "connections" else value / 1000
                    if name == "retry_delay_ms" else value)
        assert getattr(o, name.replace("_ms", "")) == expected, name
    assert {f.name for f in dataclasses.fields(CopyOptions)} == \
        {n.replace("_ms", "") for n in defaults} | {"direct"}


# invalid options: (keywords, exception)
BAD_COPY_OPTIONS: List[Tuple[Dict[str, Any], type]] = [
    ({"sparse_threshold": 1000}, ValueError),
    ({"sparse_threshold": "32M"}, ValueError),
    ({"request_size": 1000}, ValueError),
    ({"request_size": "2G"}, ValueError),
    ({"request_size": 0}, ValueError),
    ({"concurrency": 0}, ValueError),
    ({"concurrency": 1025}, ValueError),
    ({"concurrency": 1 << 32}, ValueError),  # must not wrap round to 0 or a valid count
    ({"concurrency": (1 << 32) + 4}, ValueError),
    ({"concurrency": 1 << 64}, ValueError),
    ({"concurrency": -1}, ValueError),
    ({"concurrency": "4"}, TypeError),
    ({"concurrency": True}, TypeError),
    ({"concurrency": 4.0}, TypeError),
    ({"sparse_threshold": 4.0}, TypeError),
    ({"connections": 17}, ValueError),
    ({"connections": -1}, ValueError),
    ({"requests_in_flight": 1025}, ValueError),
    ({"requests_in_flight": "64"}, TypeError),
]


@pytest.mark.parametrize("kwargs, error", BAD_COPY_OPTIONS,
                         ids=lambda v: str(v) if isinstance(v, dict) else v.__name__)
def test_bad_copy_options_refused_before_the_destination(source, tmp_path, kwargs, error):
    with pytest.raises(error) as made:
        CopyOptions(**kwargs)
    name = next(iter(kwargs))
    assert name in str(made.value)
    dst = tmp_path / "out.raw"
    with pytest.raises(error) as by_keyword:
        imgcopy.convert(source, str(dst), **kwargs)
    assert str(by_keyword.value) == str(made.value)
    assert os.listdir(str(tmp_path)) == []
    planned = {k: v for k, v in kwargs.items()
               if k in ("sparse_threshold", "request_size", "concurrency")}
    if planned:  # plan() takes no NBD options: it has no destination
        with pytest.raises(error):
            imgcopy.plan(source, **planned)


@pytest.mark.parametrize("kwargs", [kw for kw, error in BAD_COPY_OPTIONS if error is ValueError
                                    and not isinstance(next(iter(kw.values())), str)],
                         ids=str)
def test_the_copy_checks_what_the_objects_check(source, kwargs):
    """One definition: the engine refuses an invalid option with the very
    message the object gave (a CopyOptions cannot hold one to try)."""
    with pytest.raises(ValueError) as made:
        CopyOptions(**kwargs)
    src = _core.Image(source, "raw")
    sink, _ = _core.create("null:", "null", os.path.getsize(source))
    try:
        with pytest.raises(ValueError) as engine:
            _core.copy(src, sink, **kwargs)
    finally:
        sink.close()
        src.close()
    assert str(engine.value).split("argument ")[-1] == str(made.value).split("argument ")[-1]


def test_existing_destination_untouched_by_bad_options(source, tmp_path):
    dst = tmp_path / "existing.raw"
    dst.write_bytes(b"\xee" * (13 * MiB))
    before = dst.read_bytes()
    with pytest.raises(ValueError):
        imgcopy.convert(source, str(dst), create=False, options=CopyOptions(), request_size=1000)
    assert dst.read_bytes() == before


@pytest.mark.parametrize("kwargs", [
    {"sparse_threshold": 0}, {"sparse_threshold": "16M"}, {"request_size": "4k"},
    {"request_size": "1G"}, {"concurrency": 1}, {"concurrency": 1024}])
def test_edges_of_valid_ranges(kwargs):
    _core.check_copy_options(**CopyOptions(**kwargs).engine_options())


# ---------------------------------------------------------------------------
# qcow2 creation options

def qemu_info(path):
    p = subprocess.run(["qemu-img", "info", "--output=json", path], capture_output=True,
                       text=True, check=True)
    return json.loads(p.stdout)


@pytest.mark.parametrize("kwargs", [
    dict(cluster_size="4k"),
    dict(cluster_size=512, compat="0.10"),
    dict(compat="v2", preallocation="metadata"),
    dict(compress=True, cluster_size="64k"),
])
def test_create_options_object_and_keywords(source, tmp_path, kwargs):
    require_qemu_img()
    layout = Qcow2Options(**kwargs)
    a = imgcopy.convert(source, str(tmp_path / "a.qcow2"), dst_format="qcow2",
                        create_options=layout)
    b = imgcopy.convert(source, str(tmp_path / "b.qcow2"), dst_format="qcow2", **kwargs)
    assert counters(a) == counters(b)
    ia, ib = qemu_info(str(tmp_path / "a.qcow2")), qemu_info(str(tmp_path / "b.qcow2"))
    assert ia["cluster-size"] == ib["cluster-size"] == (layout.cluster_size or 65536)
    compat = ia["format-specific"]["data"]["compat"]
    assert compat == ib["format-specific"]["data"]["compat"]
    assert compat == ("0.10" if layout.compat in ("0.10", "v2") else "1.1")
    for name in ("a.qcow2", "b.qcow2"):
        p = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "qcow2", source,
                            str(tmp_path / name)], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("kwargs", [
    dict(cluster_size=1000), dict(cluster_size="4M"), dict(cluster_size=256),
    dict(compat="1.0"), dict(preallocation="full"),
    dict(compress=True, preallocation="metadata"), dict(backing_file=""),
    dict(backing_file="base.raw", backing_format="qed"),
])
def test_bad_create_options_refused_before_anything(source, tmp_path, kwargs):
    with pytest.raises(ValueError) as made:
        Qcow2Options(**kwargs)
    with pytest.raises(ValueError) as by_keyword:
        imgcopy.convert(source, str(tmp_path / "out.qcow2"), dst_format="qcow2", **kwargs)
    assert str(by_keyword.value) == str(made.value)
    assert os.listdir(str(tmp_path)) == []


def test_create_options_need_their_format(source, tmp_path):
    for dst_format in (None, "raw", "null"):
        with pytest.raises(ValueError, match="dst_format='qcow2'"):
            imgcopy.convert(source, str(tmp_path / "out.img"), dst_format=dst_format,
                            create_options=Qcow2Options(cluster_size="4k"))
        with pytest.raises(ValueError, match="dst_format='qcow2'"):
            imgcopy.convert(source, str(tmp_path / "out.img"), dst_format=dst_format,
                            compress=True)
    assert os.listdir(str(tmp_path)) == []


def test_create_keywords_replace_the_layouts_fields(source, tmp_path):
    require_qemu_img()
    dst = str(tmp_path / "out.qcow2")
    imgcopy.convert(source, dst, dst_format="qcow2", compat="0.10",
                    create_options=Qcow2Options(cluster_size="4k"))
    info = qemu_info(dst)
    assert info["cluster-size"] == 4096
    assert info["format-specific"]["data"]["compat"] == "0.10"


# ---- unknown keywords: the nearest valid one is named --------------------

def _public_calls():
    from imgcopy.info import info_chain
    return [imgcopy.convert, imgcopy.plan, imgcopy.checksum, imgcopy.compare, imgcopy.check,
            imgcopy.measure, imgcopy.open, imgcopy.map, imgcopy.info, info_chain,
            imgcopy.Image, CopyOptions, Qcow2Options]


def _typos(call):
    """Each keyword of ``call`` with a letter dropped from its middle."""
    import inspect
    for p in inspect.signature(call).parameters.values():
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and len(p.name) > 3 \
                and not p.name.startswith("_"):
            mid = len(p.name) // 2
            yield p.name, p.name[:mid] + p.name[mid + 1:]


@pytest.mark.parametrize("call", _public_calls(), ids=lambda c: c.__name__)
def test_unknown_keyword_names_the_nearest(call, tmp_path):
    dst = str(tmp_path / "never.raw")
    seen = 0
    for name, typo in _typos(call):
        args = {imgcopy.convert: ("src.raw", dst), imgcopy.compare: ("a", "b")}.get(call, ("x",))
        with pytest.raises(TypeError) as exc:
            call(*args, **{typo: 1})
        assert str(exc.value) == (f"{call.__name__}() got an unexpected keyword argument "
                                  f"{typo!r}; did you mean {name!r}?"), name
        seen += 1
    assert seen >= 2
    assert not os.path.exists(dst)


def test_unknown_keyword_messages():
    with pytest.raises(TypeError, match=r"^convert\(\) got an unexpected keyword argument "
                                        r"'sparse_treshold'; did you mean 'sparse_threshold'\?$"):
        imgcopy.convert("a", "b", sparse_treshold="4k")
    with pytest.raises(TypeError, match=r"'fmt'; did you mean 'format'\?$"):
        imgcopy.open("x", fmt="raw")
    # nothing near: Python's own message
    with pytest.raises(TypeError, match=r"^plan\(\) got an unexpected keyword argument "
                                        r"'zzz'$"):
        imgcopy.plan("x", zzz=1)
    # private keywords are not suggested
    with pytest.raises(TypeError) as exc:
        imgcopy.Image("x", sourc=True)
    assert "_source" not in str(exc.value)
    # dataclasses.replace() goes through the same check
    with pytest.raises(TypeError, match="did you mean 'concurrency'"):
        dataclasses.replace(CopyOptions(), concurency=2)
    with pytest.raises(TypeError, match="did you mean 'compression_level'"):
        Qcow2Options(compresion_level=3)


def test_checked_calls_keep_their_signatures():
    import inspect
    assert "sparse_threshold" in inspect.signature(imgcopy.convert).parameters
    assert list(inspect.signature(CopyOptions).parameters)[0] == "sparse_threshold"
    assert imgcopy.convert.__kwdefaults__["member"] is None
    assert imgcopy.convert.__name__ == "convert" and "moving only" in imgcopy.convert.__doc__
    assert CopyOptions(concurrency=2).concurrency == 2


def test_keywords_read_from_code_are_inspects():
    """suggest_keywords reads the names from the code object (importing
    inspect would cost every command's start): the same names as
    inspect.signature() gives, for every checked call and for the shapes a
    signature can take."""
    import functools
    import inspect

    from imgcopy import _keywords

    def by_signature(func):
        params = inspect.signature(func).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                               p.KEYWORD_ONLY))

    def shapes(a, /, b, *args, c, d=1):
        pass

    def takes_any(a, **kwargs):
        pass

    checked = [imgcopy.convert, imgcopy.plan, imgcopy.info, imgcopy.check, imgcopy.compare,
               imgcopy.checksum, imgcopy.measure, imgcopy.open, imgcopy.map,
               imgcopy.Image.__init__, CopyOptions.__init__, Qcow2Options.__init__]
    funcs = [f.__wrapped__ for f in checked] + [shapes, takes_any,
                                                 functools.partial(shapes, 1)]
    for func in funcs:
        assert _keywords._keywords(func) == by_signature(func), func
