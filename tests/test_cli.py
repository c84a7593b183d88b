"""``python -m imgcopy map`` (and the ``imgcopy`` console script) vs ``qemu-img map``."""

import concurrent.futures
import os
import shutil
import subprocess
import sys

import pytest

from .oracles import map_args, needs_qemu_img, qemu_img

pytestmark = needs_qemu_img

IMAGES = [("holes_and_data", 1), ("odd_size", 2), ("empty", 1), ("big_sparse", 1)]
SCRIPT_IMAGES = [("small_extents", 1)]

# every flag set is passed verbatim to both qemu-img map and imgcopy map
FLAG_SETS = [
    [],
    ["-f", "raw"],
    ["--output=json"],
    ["--output=human"],
    ["-f", "raw", "--output=json"],
    ["-f", "raw", "--output=human"],
    ["--output=json", "--start-offset", "4096"],
    ["--output=json", "--start-offset", "12345", "--max-length", "100000"],
    ["--output=json", "--max-length", "0"],
    ["--output=json", "--start-offset", "999999999999"],
    ["--output=human", "--start-offset", "65536", "--max-length", "1048576"],
    ["-f", "raw", "--output=json", "--start-offset=512", "--max-length=3000000"],
    ["--output", "json"],
    ["--output=json", "--start-offset", "64k", "--max-length", "1M"],
]


def _cli(cmd, args, env, cwd):
    return subprocess.run(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=cwd, timeout=60)


def _console_script():
    cand = os.path.join(os.path.dirname(sys.executable), "imgcopy")
    if os.path.isfile(cand) and os.access(cand, os.X_OK):
        return cand
    return shutil.which("imgcopy")


def _make_cli(kind, imgcopy_env, tmp_path):
    if kind == "module":
        cmd = [sys.executable, "-m", "imgcopy"]
    else:
        script = _console_script()
        if script is None:
            pytest.skip("imgcopy console script not installed (not next to %s nor on PATH)" % sys.executable)
        cmd = [script]
    return lambda args: _cli(cmd, args, imgcopy_env, str(tmp_path))


@pytest.fixture(params=["module", "script"])
def cli(request, imgcopy_env, tmp_path):
    return _make_cli(request.param, imgcopy_env, tmp_path)


@pytest.fixture
def module_cli(imgcopy_env, tmp_path):
    return _make_cli("module", imgcopy_env, tmp_path)


@pytest.fixture
def script_cli(imgcopy_env, tmp_path):
    return _make_cli("script", imgcopy_env, tmp_path)


def _compare(cli, path, flag_sets):
    """Run qemu-img map and imgcopy map with each flag set (in parallel); list mismatches."""

    def one(flags):
        exp = qemu_img("map", "-U", *flags, path)
        got = cli(["map"] + flags + [path])
        if got.returncode != 0 or got.stdout != exp.stdout:
            return ("flags %r: rc=%d stderr=%r\n  qemu:    %r\n  imgcopy: %r"
                    % (flags, got.returncode, got.stderr, exp.stdout, got.stdout))
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as ex:
        return [r for r in ex.map(one, flag_sets) if r]


@pytest.mark.parametrize("kind,seed", IMAGES, ids=["%s-%d" % i for i in IMAGES])
def test_module_map_matches_qemu(module_cli, make_image, kind, seed):
    im = make_image(kind, seed)
    failures = _compare(module_cli, im.path, FLAG_SETS)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kind,seed", SCRIPT_IMAGES, ids=["%s-%d" % i for i in SCRIPT_IMAGES])
def test_script_map_matches_qemu(script_cli, make_image, kind, seed):
    im = make_image(kind, seed)
    failures = _compare(script_cli, im.path, [[], ["--output=json"], FLAG_SETS[7], FLAG_SETS[10]])
    assert not failures, "\n".join(failures)


def test_cli_relative_path_human(cli, make_image, tmp_path):
    """The human format prints the file name exactly as given on the command line."""
    im = make_image("holes_and_data", 2)
    rel = os.path.relpath(im.path, str(tmp_path))
    exp = qemu_img(*map_args(rel, "raw"), cwd=tmp_path)
    got = cli(["map", "-f", "raw", rel])
    assert got.returncode == 0, got.stderr
    assert got.stdout == exp.stdout


def test_cli_missing_file(cli, tmp_path):
    p = str(tmp_path / "no-such-image.raw")
    got = cli(["map", "--output=json", p])
    assert got.returncode != 0
    assert got.stdout == ""
    err = got.stderr.strip()
    assert "Traceback" not in got.stderr
    assert len(err.splitlines()) == 1, got.stderr
    assert p in err


def test_cli_directory(cli, tmp_path):
    got = cli(["map", str(tmp_path)])
    assert got.returncode != 0
    assert "Traceback" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert str(tmp_path) in got.stderr


def _all_parsers():
    import argparse
    from imgcopy.cli import _build_parser
    top = _build_parser()
    out = [("imgcopy", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += sorted(action.choices.items())
    return out


def test_one_command_parser_answers_as_all_of_them(capsys):
    """`imgcopy COMMAND ...` builds that command's parser alone: its name is
    the one the module registers, the arguments parse the same, and its
    usage errors and --help say the same as with every parser built."""
    from imgcopy.cli import COMMANDS, _build_parser, command_name

    registered = dict(_all_parsers()[1:])
    assert sorted(command_name(c) for c in COMMANDS) == sorted(registered)
    for argv in (["convert", "-O", "qcow2", "-c", "a", "b"], ["map", "--output", "json", "x"],
                 ["convert-many", "jobs.json"], ["convert", "a"], ["map", "-x", "y"],
                 ["measure", "--help"], ["checksum", "a", "b", "c"]):
        said = []
        for parser in (_build_parser(argv), _build_parser()):
            try:
                args, extra = parser.parse_known_args(argv)
                if extra:
                    args.parser.error("unrecognized arguments: " + " ".join(extra))
                said.append({k: v for k, v in vars(args).items()
                             if k not in ("func", "parser")})
            except SystemExit as e:
                said.append(e.code)
            said.append(capsys.readouterr())
        assert said[:2] == said[2:], argv


def test_no_abbreviations_on_any_parser():
    parsers = _all_parsers()
    assert {"map", "info", "convert", "checksum", "check"} <= {n for n, _ in parsers}
    for name, parser in parsers:
        assert parser.allow_abbrev is False, name


@pytest.mark.parametrize("args", [
    ["map", "--max-len", "10"],
    ["map", "--out=json"],
    ["info", "--backing"],
    ["convert", "--target-is", "-n"],
    ["convert", "--request", "1M"],
    ["checksum", "--block", "4k"],
    ["check", "--out=json"],
])
def test_abbreviated_flags_are_refused(args, tmp_path, capsys):
    from imgcopy.cli import main
    src = str(tmp_path / "a.raw")
    with open(src, "wb") as f:
        f.write(b"\1" * 4096)
    files = [src, str(tmp_path / "b.raw")] if args[0] == "convert" else [src]
    with pytest.raises(SystemExit) as exc:
        main(args + files)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and args[1 if len(args) > 1 else 0].split("=")[0] \
        in err, err
    assert not os.path.exists(str(tmp_path / "b.raw"))
    # spelt out, the same flags work
    full = {"--max-len": "--max-length", "--out=json": "--output=json",
            "--backing": "--backing-chain", "--target-is": "--target-is-zero",
            "--request": "--request-size", "--block": "--block-size"}
    spelt = [full.get(a, a) for a in args]
    if spelt[0] == "convert":
        return  # -n needs an existing destination: the flag's own tests run it
    # a raw image has no checks: qemu-img check's 63
    assert main(spelt + files) == (63 if spelt[0] == "check" else 0)


def test_top_level_flags_are_not_abbreviated(capsys):
    from imgcopy.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["--vers"])
    assert exc.value.code == 2 and "imgcopy " not in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("imgcopy ")
