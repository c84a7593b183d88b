"""Seeds of the qcow2 fuzzer's resume path (make_seeds_qcow2.sh runs this):
qcow2 images imgcopy's writer left incomplete, as a crash after a
checkpoint leaves them (v3 marked dirty and corrupt, v2 without magic, no
refcount table; tables of the last checkpoint on disk, later writes not),
cut after their last cluster as a resumed writer cuts them.  No qemu tool
makes these.  Usage: python3 make_seeds_qcow2_resume.py OUTDIR (imgcopy
built: `make build`)."""
import os
import sys

from imgcopy import _core


def last_cluster_end(path, cluster_size):
    """The end of the last cluster holding a nonzero byte."""
    with open(path, "rb") as f:
        data = f.read()
    end = len(data.rstrip(b"\0"))
    return (end + cluster_size - 1) // cluster_size * cluster_size


def partial(path, size, cluster_size, writes, **options):
    img, _ = _core.create(path, "qcow2", size, atomic=False, cluster_size=cluster_size,
                          **options)
    for item in writes:
        if item == "checkpoint":
            img.checkpoint()
        elif item[1] is None:
            img.zero(item[0], item[2])
        else:
            img.write(item[0], item[1])
    img.close()  # unfinished
    os.truncate(path, last_cluster_end(path, cluster_size))


def main(out):
    cs = 512
    partial(os.path.join(out, "resume-v3-512.qcow2"), 96 * 1024, cs, [
        (0, b"\x61" * 3 * cs), (40 * 1024, b"\x62" * cs), "checkpoint",
        (0, None, cs), (70 * 1024 + 100, b"\x63" * 1000), (90 * 1024, b"\x64" * 2 * cs),
        "checkpoint", (20 * 1024, b"\x65" * cs),  # after the last checkpoint: lost
    ])
    cs = 4096
    partial(os.path.join(out, "resume-v2-4k-compressed.qcow2"), 256 * 1024, cs, [
        (0, b"\x71" * 2 * cs), (64 * 1024, bytes(range(256)) * 16), "checkpoint",
        (128 * 1024, b"\x72" * cs), "checkpoint",
    ], compat="0.10", compress=True)
    if _core.compression_libraries().get("zstd"):
        partial(os.path.join(out, "resume-v3-4k-zstd.qcow2"), 256 * 1024, cs, [
            (8 * cs, b"\x81" * 3 * cs), "checkpoint", (8 * cs, None, cs),
            (200 * 1024, b"\x82" * cs), "checkpoint",
        ], compress=True, compression_type="zstd")


if __name__ == "__main__":
    main(sys.argv[1])
