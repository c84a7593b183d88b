"""Resuming a qcow2 image a crash interrupted (issue 27): ``Image.checkpoint()``
and ``Image(path, "qcow2", writable=True, resume=True)``, qemu-img the oracle.

A forked child creates a qcow2 image (``_core.create``, as a copy's
destination is made) and writes a pattern in steps, taking checkpoints
between them and telling the parent, through a pipe, which steps had
completed before each checkpoint that returned.  The parent SIGKILLs it:
right after a checkpoint, in the middle of the writes after one (the child
waits there), or at random moments (inside a checkpoint, inside finish,
with writer threads going on while another takes checkpoints).  Then it
does what a resumed copy does: opens the partial file with resume=True,
checks that every recorded step reads back, writes every step not
recorded, finishes, and asks ``qemu-img check`` (no error, no leak) and
``qemu-img compare`` against a raw file of the expected content.

Images: compat 0.10 and 1.1, 512 B, 64 KiB and 2 MiB clusters, compressed
clusters, disks larger than what one L2 table covers, an overlay.  Then
hostile partial files (truncated, L1 and L2 entries pointing at the
header, each other, unaligned or past the end) must be refused with
ImageFormatError, never crash.  tests/c/test_qcow2_resume.c crashes a
writer at every change of its file (kills, power cuts, torn writes).
"""

import os
import random
import signal
import struct
import sys
import threading
import time
import traceback

import pytest

import imgcopy
from imgcopy import _core

from .oracles import assert_same_content, needs_qemu_img, qemu_check, qemu_info
from .units import KiB, MiB

pytestmark = needs_qemu_img

# what the child reports: a checkpoint returned (the steps done before it
# began), it stopped where it was told to, it finished
CHECKPOINT, STOPPED, FINISHED = 0, 1, 2


class Config:
    def __init__(self, compat, cluster_size, size, compress=False, nsteps=24, every=3):
        self.compat, self.cluster_size, self.size = compat, cluster_size, size
        self.compress, self.nsteps, self.every = compress, nsteps, every

    def keywords(self):
        kw = {"compat": self.compat, "cluster_size": self.cluster_size}
        if self.compress:
            kw["compress"] = True
        return kw

    def __repr__(self):
        cs = self.cluster_size
        return "%s-%s%s" % (self.compat, "%dk" % (cs // KiB) if cs >= KiB else "%db" % cs,
                            "-compressed" if self.compress else "")


CONFIGS = [
    Config("1.1", 64 * KiB, 1100 * MiB),     # three L2 tables (512 MiB each)
    Config("0.10", 64 * KiB, 1100 * MiB),
    Config("1.1", 512, 3 * MiB),             # an L2 table covers 32 KiB
    Config("0.10", 512, 3 * MiB),
    Config("1.1", 2 * MiB, 160 * MiB, nsteps=12),
    Config("1.1", 64 * KiB, 1100 * MiB, compress=True),
    Config("0.10", 4 * KiB, 24 * MiB, compress=True),  # a table covers 2 MiB
]


def step_data(i, length, offset):
    """Step i's bytes: compressible runs, every fourth step noise."""
    if i % 4 == 3:
        return random.Random(i * 7919 + offset).randbytes(length)
    unit = bytes([(i * 29 + k) % 251 + 1 for k in range(64)])
    return (unit * (length // 64 + 1))[:length]


def make_steps(cfg, seed=1):
    """(offset, length, data or None for zeros) steps spread over the disk:
    data steps on disjoint ranges (whole clusters when compressed: a
    compressed cluster is written once), every fifth step zeros inside an
    earlier one."""
    rnd = random.Random(seed)
    cs, n = cfg.cluster_size, cfg.nsteps
    slot = cfg.size // n // cs * cs
    assert slot >= 4 * cs, cfg
    steps = []
    for i in range(n):
        if i % 5 == 4:
            off, length, _ = steps[rnd.randrange(i)]
            start = off + rnd.randrange(length)
            steps.append((start, rnd.randrange(1, off + length - start + 1), None))
            continue
        off = i * slot + rnd.randrange(slot // cs - 3) * cs
        length = rnd.randrange(1, 4) * cs
        if not cfg.compress:
            off += rnd.randrange(cs)
            length += rnd.randrange(cs) - cs // 2
        steps.append((off, length, step_data(i, length, off)))
    return steps


def write_expected(path, cfg, steps):
    with open(path, "wb") as f:
        f.truncate(cfg.size)
        for off, length, data in steps:
            f.seek(off)
            f.write(data if data is not None else bytes(length))


def apply_step(img, step):
    off, length, data = step
    if data is None:
        img.zero(off, length)
    else:
        img.write(off, data)


def expected_bytes(steps, upto, off, length):
    """[off, off+length) after steps[:upto]."""
    buf = bytearray(length)
    for s_off, s_len, data in steps[:upto]:
        a, b = max(off, s_off), min(off + length, s_off + s_len)
        if a < b:
            buf[a - off:b - off] = data[a - s_off:b - s_off] if data is not None else bytes(b - a)
    return bytes(buf)


def overlaps(step, others):
    off, length, _ = step
    return any(o < off + length and off < o + n for o, n, _ in others)


def report(fd, kind, value=0):
    os.write(fd, struct.pack("<II", kind, value))


def read_reports(fd):
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return [struct.unpack_from("<II", data, k) for k in range(0, len(data) - 7, 8)]


def fork_writer(body):
    """Run body(report_fd) in a child; returns (pid, read end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 0
        try:
            os.close(r)
            body(w)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    return pid, r


def kill_and_reap(pid, r, *, delay=None, until=None):
    """SIGKILL the child after `delay` seconds, or once it reports `until`;
    the reports it made."""
    reports = []
    if until is not None:
        buf = b""
        while True:
            chunk = os.read(r, 8)
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 8:
                reports.append(struct.unpack("<II", buf[:8]))
                buf = buf[8:]
            if reports and reports[-1][0] == until:
                break
    elif delay is not None:
        time.sleep(delay)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    reports += read_reports(r)
    os.close(r)
    assert (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL) or \
        (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0), "the writer failed: %#x" % status
    return reports


def sequential_writer(path, cfg, steps, stop_after=None):
    """Every step in order, a checkpoint every cfg.every steps, then
    finish; with stop_after, wait (for the kill) after that step."""
    def body(fd):
        img, _ = _core.create(path, "qcow2", cfg.size, atomic=False, **cfg.keywords())
        for i, step in enumerate(steps):
            if i % cfg.every == 0:
                img.checkpoint()
                report(fd, CHECKPOINT, i)
            apply_step(img, step)
            if i == stop_after:
                report(fd, STOPPED, i)
                time.sleep(600)
        img.checkpoint()
        report(fd, CHECKPOINT, len(steps))
        img.finish()
        report(fd, FINISHED)
    return body


def recorded_steps(reports):
    done = [v for kind, v in reports if kind == CHECKPOINT]
    return done[-1] if done else None


def resume_and_finish(path, cfg, steps, todo, expected, recorded=()):
    """What a resumed copy does: open with resume=True, check the recorded
    steps read back, write the steps in `todo` (in order), finish; then
    qemu-img check and compare."""
    img = _core.Image(path, "qcow2", writable=True, resume=True)
    try:
        later = [steps[i] for i in todo]
        for i in recorded:  # steps[:len(recorded)]
            off, length, _ = steps[i]
            if overlaps(steps[i], later):
                continue
            assert img.read(off, length) == expected_bytes(steps, len(recorded), off, length), \
                "step %d (%d+%d), recorded, does not read back" % (i, off, length)
        for i in todo:
            apply_step(img, steps[i])
        img.finish()
    finally:
        img.close()
    qemu_check(path, "qcow2", strict=True)
    info = qemu_info(path)
    assert info["format-specific"]["data"]["compat"] == cfg.compat, info
    assert_same_content(expected, path, "raw", "qcow2")


@pytest.fixture(scope="module")
def expected_files(tmp_path_factory):
    """Each configuration's steps and the raw file of their content."""
    made = {}

    def get(cfg):
        key = repr(cfg)
        if key not in made:
            steps = make_steps(cfg)
            path = str(tmp_path_factory.mktemp("expected") / (key + ".raw"))
            write_expected(path, cfg, steps)
            made[key] = (steps, path)
        return made[key]
    return get


@pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
def test_kill_after_writes_past_a_checkpoint(tmp_path, cfg, expected_files):
    """Killed while waiting in the middle of the writes that follow a
    checkpoint: what the checkpoint recorded is there; the rest, written
    again, makes a clean image with the whole content."""
    steps, expected = expected_files(cfg)
    for stop_after in (cfg.every * 2 + 1, cfg.nsteps - 2):
        path = str(tmp_path / ("partial-%d.qcow2" % stop_after))
        pid, r = fork_writer(sequential_writer(path, cfg, steps, stop_after=stop_after))
        reports = kill_and_reap(pid, r, until=STOPPED)
        done = recorded_steps(reports)
        assert done is not None and done <= stop_after < done + cfg.every, reports
        # the header still says incomplete: v3 dirty and corrupt, v2 no magic
        with open(path, "rb") as f:
            head = f.read(80)
        if cfg.compat == "0.10":
            assert head[:4] == b"\0\0\0\0", head[:4]
        else:
            assert head[:4] == b"QFI\xfb" and struct.unpack(">Q", head[72:80])[0] & 3 == 3
        resume_and_finish(path, cfg, steps, range(done, len(steps)), expected, range(done))


@pytest.mark.parametrize("cfg", CONFIGS[:6], ids=repr)
def test_kill_at_random_moments(tmp_path, cfg, expected_files):
    """Killed at random moments, inside checkpoints and finish too."""
    steps, expected = expected_files(cfg)
    rnd = random.Random(repr(cfg))
    # how long the whole run takes, to spread the kills over it
    path = str(tmp_path / "timing.qcow2")
    t0 = time.monotonic()
    pid, r = fork_writer(sequential_writer(path, cfg, steps))
    reports = kill_and_reap(pid, r, until=FINISHED)
    span = time.monotonic() - t0
    assert reports[-1][0] == FINISHED
    for k in range(6):
        path = str(tmp_path / ("partial-%d.qcow2" % k))
        pid, r = fork_writer(sequential_writer(path, cfg, steps))
        reports = kill_and_reap(pid, r, delay=rnd.uniform(0, span * 1.1))
        done = recorded_steps(reports)
        if done is None:
            # no checkpoint returned: the copy starts over
            continue
        finished = any(kind == FINISHED for kind, _ in reports)
        todo = range(done, len(steps)) if not finished else range(0)
        resume_and_finish(path, cfg, steps, todo, expected, range(done))


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3], CONFIGS[6]], ids=repr)
def test_kill_the_resumed_writer_too(tmp_path, cfg, expected_files):
    """A resumed copy killed in turn resumes again: the tables it loaded
    go back in place, its own new ones are linked by its checkpoints."""
    steps, expected = expected_files(cfg)
    path = str(tmp_path / "twice.qcow2")
    pid, r = fork_writer(sequential_writer(path, cfg, steps, stop_after=cfg.every + 1))
    first = recorded_steps(kill_and_reap(pid, r, until=STOPPED))
    stop = len(steps) - cfg.every

    def resumed(fd):
        img = _core.Image(path, "qcow2", writable=True, resume=True)
        for i in range(first, len(steps)):
            if (i - first) % cfg.every == 0:
                img.checkpoint()
                report(fd, CHECKPOINT, i)
            apply_step(img, steps[i])
            if i == stop:
                report(fd, STOPPED, i)
                time.sleep(600)

    pid, r = fork_writer(resumed)
    second = recorded_steps(kill_and_reap(pid, r, until=STOPPED))
    assert first < second <= stop, (first, second)
    resume_and_finish(path, cfg, steps, range(second, len(steps)), expected, range(second))


def read_recorded(data):
    """The steps of the last whole report of a threaded writer."""
    recorded, pos = None, 0
    while pos + 4 <= len(data):
        (count,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + 4 * count > len(data):
            break
        recorded = struct.unpack_from("<%dI" % count, data, pos + 4)
        pos += 4 + 4 * count
    return recorded


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3], CONFIGS[5]], ids=repr)
def test_kill_writer_threads(tmp_path, cfg):
    """Writer threads go on while the main thread takes checkpoints, each
    recording the steps completed before it began; killed at random."""
    many = Config(cfg.compat, cfg.cluster_size, cfg.size, cfg.compress, nsteps=150)
    steps = [s for s in make_steps(many, seed=2) if s[2] is not None]  # disjoint: any order
    expected = str(tmp_path / "expected.raw")
    write_expected(expected, cfg, steps)
    n = len(steps)

    def writer(path):
        def body(fd):
            img, _ = _core.create(path, "qcow2", cfg.size, atomic=False, **cfg.keywords())
            lock, done, queue = threading.Lock(), set(), list(range(n))
            random.Random(5).shuffle(queue)

            def work():
                while True:
                    with lock:
                        if not queue:
                            return
                        i = queue.pop()
                    apply_step(img, steps[i])
                    with lock:
                        done.add(i)
                    time.sleep(0.004)  # the writes last: kills land among them

            def checkpoint():
                with lock:
                    before = sorted(done)
                img.checkpoint()
                os.write(fd, struct.pack("<I%dI" % len(before), len(before), *before))
            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                checkpoint()
            for t in threads:
                t.join()
            checkpoint()
            os.write(fd, struct.pack("<I", 0xffffffff))  # all written: the report ends
            time.sleep(600)
        return body

    def run(path, delay):
        """Kill after `delay` seconds (None: once all is written); the
        steps recorded, and when the first and last reports came."""
        pid, r = fork_writer(writer(path))
        t0 = time.monotonic()
        data, first = b"", None
        if delay is None:
            while not data.endswith(struct.pack("<I", 0xffffffff)):
                chunk = os.read(r, 65536)
                assert chunk, "the writer died"
                data += chunk
                first = first or time.monotonic() - t0
        else:
            time.sleep(delay)
        end = time.monotonic() - t0
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        return read_recorded(data), first, end

    # kills spread over the time the threads write
    _, first, end = run(str(tmp_path / "timing.qcow2"), None)
    rnd = random.Random(11)
    resumed = 0
    for k in range(6):
        path = str(tmp_path / ("partial-%d.qcow2" % k))
        recorded, _, _ = run(path, rnd.uniform(first, end))
        if os.environ.get("IMGCOPY_RESUME_VERBOSE"):
            print("threads: %s of %d steps recorded" % (recorded and len(recorded), n))
        if recorded is None:
            continue
        resumed += 1
        todo = [i for i in range(n) if i not in set(recorded)]
        img = _core.Image(path, "qcow2", writable=True, resume=True)
        try:
            for i in recorded:
                off, length, data_i = steps[i]
                assert img.read(off, length) == data_i, "step %d, recorded, lost" % i
            for i in todo:
                # a resumed copy may write part of a cluster first (zeros
                # in the source): a compressed cluster in flight at the
                # kill must not be one that needs inflating then
                off, length, _ = steps[i]
                img.zero(off + 1000, 100)
                apply_step(img, steps[i])
            img.finish()
        finally:
            img.close()
        qemu_check(path, "qcow2", strict=True)
        assert_same_content(expected, path, "raw", "qcow2")
    assert resumed, "no kill came after a checkpoint"


def test_resume_overlay(tmp_path):
    """An overlay (backing_file) resumes too: what it does not hold still
    reads from its backing file."""
    base = str(tmp_path / "base.raw")
    size = 4 * MiB
    with open(base, "wb") as f:
        f.write(bytes([7]) * size)
    path = str(tmp_path / "top.qcow2")
    chunks = [(k * 256 * KiB + 1000, 70000, bytes([k + 1]) * 70000) for k in range(12)]
    expected = str(tmp_path / "expected.raw")
    with open(expected, "wb") as f:
        f.write(bytes([7]) * size)
        for off, length, data in chunks:
            f.seek(off)
            f.write(data)

    def body(fd):
        img, _ = _core.create(path, "qcow2", size, atomic=False, backing_file="base.raw",
                              backing_format="raw", cluster_size=64 * KiB)
        for i, c in enumerate(chunks):
            if i == 5:
                img.checkpoint()
                report(fd, CHECKPOINT, i)
            apply_step(img, c)
        report(fd, STOPPED)
        time.sleep(600)

    pid, r = fork_writer(body)
    reports = kill_and_reap(pid, r, until=STOPPED)
    assert recorded_steps(reports) == 5
    img = _core.Image(path, "qcow2", writable=True, resume=True)
    try:
        assert img.read(chunks[2][0] - 10, 20) == bytes([7]) * 10 + bytes([3]) * 10
        for c in chunks[5:]:
            apply_step(img, c)
        img.finish()
    finally:
        img.close()
    qemu_check(path, "qcow2", strict=True)
    assert qemu_info(path)["backing-filename"] == "base.raw"
    assert_same_content(expected, path, "raw", "qcow2")


def test_resume_complete_image(tmp_path):
    """A complete image opens as without resume (a crash after finish):
    finishing again changes nothing."""
    path = str(tmp_path / "done.qcow2")
    img, _ = _core.create(path, "qcow2", 8 * MiB, atomic=False)
    img.write(MiB, b"x" * 100000)
    img.finish()
    img.close()
    before = open(path, "rb").read()
    img = _core.Image(path, "qcow2", writable=True, resume=True)
    img.finish()
    img.close()
    assert open(path, "rb").read() == before
    qemu_check(path, "qcow2", strict=True)


def test_resume_options(tmp_path):
    """resume needs writable; a v2 image left incomplete has no magic, so
    only a named format finds it; raw takes the flag and ignores it."""
    raw = str(tmp_path / "d.raw")
    with open(raw, "wb") as f:
        f.truncate(MiB)
    with pytest.raises(ValueError, match="for writing"):
        _core.Image(raw, "raw", resume=True)
    img = _core.Image(raw, "raw", writable=True, resume=True)
    img.write(0, b"abc")
    img.checkpoint()
    img.close()
    path = str(tmp_path / "v2.qcow2")
    img, _ = _core.create(path, "qcow2", MiB, atomic=False, compat="0.10")
    img.write(0, b"abc")
    img.checkpoint()
    img.close()  # not finished: as a crash leaves it
    with pytest.raises(imgcopy.ImageFormatError, match="magic"):
        _core.Image(path, "qcow2", writable=True)
    probed = _core.Image(path, None, writable=True, resume=True)
    assert probed.format == "raw"
    probed.close()
    img = _core.Image(path, "qcow2", writable=True, resume=True)
    assert img.read(0, 3) == b"abc"
    img.finish()
    img.close()
    qemu_check(path, "qcow2", strict=True)


# --------------------------------------------------------------------------
# hostile partial files

def partial_image(tmp_path, name="partial.qcow2", compat="1.1", cluster_size=64 * KiB):
    """An incomplete image with two checkpoints behind it: its header, L1
    offset and cluster size, and its L1 entries."""
    path = str(tmp_path / name)
    img, _ = _core.create(path, "qcow2", 2 * 1024 * MiB, atomic=False, compat=compat,
                          cluster_size=cluster_size)
    img.write(0, b"a" * 3 * cluster_size)
    img.checkpoint()
    img.write(600 * MiB, b"b" * cluster_size)
    img.write(1100 * MiB, bytes(range(256)) * (cluster_size // 256))
    img.checkpoint()
    img.close()
    with open(path, "rb") as f:
        head = f.read(72)
    l1_size, l1_off = struct.unpack_from(">IQ", head, 36)
    with open(path, "rb") as f:
        f.seek(l1_off)
        l1 = list(struct.unpack(">%dQ" % l1_size, f.read(8 * l1_size)))
    return path, l1_off, l1


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def l2_offset(l1, index=0):
    return l1[index] & 0x00FFFFFFFFFFFE00


HOSTILE = {
    # L1 entries
    "l1-points-at-header": lambda p, l1o, l1: patch(p, l1o, struct.pack(">Q", 1 << 63)),
    "l1-points-at-l1": lambda p, l1o, l1: patch(p, l1o, struct.pack(">Q", l1o | 1 << 63)),
    "l1-unaligned": lambda p, l1o, l1: patch(p, l1o, struct.pack(">Q", l1[0] + 512)),
    "l1-past-eof": lambda p, l1o, l1: patch(p, l1o, struct.pack(">Q", (1 << 40) | 1 << 63)),
    "l1-reserved-bits": lambda p, l1o, l1: patch(p, l1o, struct.pack(">Q", l1[0] | 1 << 60)),
    "l1-not-copied": lambda p, l1o, l1: patch(p, l1o, struct.pack(">Q", l1[0] & ~(1 << 63))),
    "l1-same-table-twice": lambda p, l1o, l1: patch(p, l1o + 8, struct.pack(">Q", l1[0])),
    # L2 entries
    "l2-data-at-l1": lambda p, l1o, l1: patch(p, l2_offset(l1), struct.pack(">Q", l1o | 1 << 63)),
    "l2-data-twice": lambda p, l1o, l1: patch(
        p, l2_offset(l1) + 8, open(p, "rb").read()[l2_offset(l1):l2_offset(l1) + 8]),
    "l2-data-past-eof": lambda p, l1o, l1: patch(p, l2_offset(l1),
                                                 struct.pack(">Q", (1 << 45) | 1 << 63)),
    "l2-reserved-bits": lambda p, l1o, l1: patch(p, l2_offset(l1), struct.pack(">Q", 0x1fe | 1 << 63 | 1 << 20)),
    "l2-compressed-in-header": lambda p, l1o, l1: patch(p, l2_offset(l1), struct.pack(">Q", 1 << 62 | 100)),
    "l2-compressed-past-eof": lambda p, l1o, l1: patch(p, l2_offset(l1),
                                                       struct.pack(">Q", 1 << 62 | (1 << 40))),
    "l2-compressed-over-table": lambda p, l1o, l1: patch(p, l2_offset(l1), struct.pack(
        ">Q", 1 << 62 | l2_offset(l1))),
    # the file cut short: its tables past the end
    "truncated-after-l1": lambda p, l1o, l1: os.truncate(p, l1o + 64 * KiB),
    "truncated-inside-header": lambda p, l1o, l1: os.truncate(p, 50),
    "header-zeroed": lambda p, l1o, l1: patch(p, 0, bytes(104)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_partial_file(tmp_path, case):
    """Damage a partial file's metadata: resuming it refuses clearly."""
    path, l1_off, l1 = partial_image(tmp_path)
    assert l2_offset(l1) and l2_offset(l1, 1) and l2_offset(l1, 2), l1[:3]
    HOSTILE[case](path, l1_off, l1)
    size = os.path.getsize(path)
    with pytest.raises(imgcopy.ImageFormatError) as info:
        _core.Image(path, "qcow2", writable=True, resume=True)
    assert info.value.filename == path and info.value.reason, info.value
    assert os.path.getsize(path) == size, "a refused image was changed"


@pytest.mark.parametrize("compat", ["0.10", "1.1"])
def test_hostile_header_of_v2(tmp_path, compat):
    """A partial file whose header claims nonsense (an absurd L1 size, a
    missing refcount table on a complete image) is refused."""
    path, l1_off, _ = partial_image(tmp_path, compat=compat)
    patch(path, 36, struct.pack(">I", 0xffffffff))  # l1_size
    with pytest.raises(imgcopy.ImageFormatError):
        _core.Image(path, "qcow2", writable=True, resume=True)
    path, _, _ = partial_image(tmp_path, name="clean-marks.qcow2", compat=compat)
    # marked complete, but without a refcount table: not resumable as is
    patch(path, 0, b"QFI\xfb")
    if compat == "1.1":
        patch(path, 72, bytes(8))
    with pytest.raises(imgcopy.ImageFormatError, match="refcount"):
        _core.Image(path, "qcow2", writable=True, resume=True)
