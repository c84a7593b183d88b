"""Size units of the test-suite, defined once: ``from .units import KiB, MiB``."""

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
PiB = 1 << 50


def round_up(n, a):
    """n rounded up to a multiple of a."""
    return (n + a - 1) // a * a
