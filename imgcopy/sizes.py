"""Byte counts as qemu-img spells them: ``4096``, ``"64k"``, ``"4M"``,
``"1.5G"`` (powers of 1024), accepted wherever imgcopy takes a size; and the words every view prints
sizes and shares with (human_size, share_text, the extent kinds' LABELS)."""
from __future__ import annotations

import math

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Union

    Size = Union[int, str]  # (for annotations: a type checker's name only)

_SUFFIXES = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
             "p": 1 << 50, "e": 1 << 60}


def parse_size(value: Size, what: str = "size") -> int:
    """An int, or a string with an optional k/M/G/T/P/E suffix; ValueError
    (naming ``what``) for anything else or a negative count."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be an int or a size string such as '64k', "
                        f"not {type(value).__name__}")
    if isinstance(value, int):
        result = value
    else:
        text = value.strip().lower()
        unit = text[-1:] if text[-1:] in _SUFFIXES and not text[-1:].isdigit() else ""
        number = text[: len(text) - len(unit)]
        try:
            amount = float(number) if "." in number else int(number, 0)
        except ValueError:
            raise ValueError(f"{what}: invalid size {value!r} (e.g. 4096, '64k', '4M')") \
                from None
        result = int(amount * _SUFFIXES[unit])
        if isinstance(amount, float) and amount * _SUFFIXES[unit] != result:
            raise ValueError(f"{what}: {value!r} is not a whole number of bytes")
    if result < 0:
        raise ValueError(f"{what} must not be negative: {value!r}")
    return result


# What a run of guest bytes is: "data" is read from the image itself,
# "backing" from a backing file, "zero" is storage known to read as zeros
# (allocated zeros: never read), "zeroed" reads as zeros because a layer's
# own metadata says so (a qcow2 zero cluster, a vmdk zero grain, a vhdx zero
# block) over layers whose data it hides, "hole" has no data at all.
# A copy reads only "data" and "backing".  In a dirty map (dirty_map()),
# "dirty" is what a persistent bitmap marks changed, whatever it holds: the
# other kinds are then the clean ranges.
KINDS = ("dirty", "data", "backing", "zero", "zeroed", "hole")

# The words every view uses for the kinds (repr, summary(), HTML, plot()).
LABELS = {"dirty": "dirty", "data": "data", "backing": "backing data",
          "zero": "allocated zeros", "zeroed": "zeroed", "hole": "holes"}

_SIZE_UNITS = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def human_size(n: int) -> str:
    """A byte count as qemu-img prints it ("1.31 MiB", "977 KiB", "0 B"):
    three significant digits, switching unit at 1000 of the smaller one."""
    _, exp = math.frexp(n / (1000.0 / 1024.0))
    i = min(max(int((exp - 1) / 10), 0), len(_SIZE_UNITS) - 1)
    return "%0.3g %sB" % (n / (1 << (i * 10)), _SIZE_UNITS[i])


def share_text(n: int, span: int) -> str:
    """n as a percentage of span, as the views print it: one decimal,
    "<0.1%" for a share too small to show but not nothing."""
    if not span:
        return "0%"
    pct = 100.0 * n / span
    if n and pct < 0.05:
        return "<0.1%"
    if n != span and pct > 99.95:
        return ">99.9%"
    return f"{pct:.1f}%"
