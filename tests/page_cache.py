"""What the page cache holds of a file, for tests of what a copy leaves
there (and of reads that must reach the disk)."""
import ctypes
import mmap
import os
import time


def evict(path, tries=20):
    """Drop the file's pages, again until none is left (up to `tries`
    times): pages another CPU has just added to its LRU batches stay
    through a drop (the kernel drains only the caller's CPU's), and on a
    busy machine more than once (one suite run in eight kept some through
    two drops, and its page-cache tests skipped)."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        for _ in range(tries):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            time.sleep(0.05)
            if not size or cached_share(path, size) == 0:
                break
    finally:
        os.close(fd)


def is_cold(path, offset):
    """Whether the page at `offset` is not in the page cache (tmpfs keeps
    everything: nothing there is ever read from a disk).  Asking does not
    read it: a read that must not wait fails instead."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], offset, os.RWF_NOWAIT)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False  # no RWF_NOWAIT here: cannot tell
    finally:
        os.close(fd)


def cached_share(path, size, samples=64):
    """The share of `samples` pages spread over [0, size) in the page
    cache, by mincore() of the file mapped: asking reads nothing (a read
    that must not wait still starts readahead)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    pages = size // mmap.PAGESIZE
    vec = ctypes.create_string_buffer(pages)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    step = pages // samples
    return sum(vec.raw[i * step] & 1 for i in range(samples)) / samples
