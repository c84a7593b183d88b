"""Byte counts as qemu-img spells them: ``4096``, ``"64k"``, ``"4M"``,
``"1.5G"`` (powers of 1024), accepted wherever imgcopy takes a size."""
from __future__ import annotations

from typing import Union

Size = Union[int, str]

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
