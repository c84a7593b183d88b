"""Records without dataclasses: the classes ``imgcopy info`` and ``map``
return (ImageInfo, Snapshot, Bitmap) get from here what their dataclass
gave them, a repr and == over their fields (hashing and no assignment for
the frozen ones), and their own __init__.  Importing dataclasses (and
inspect with it: ast, dis, tokenize, ...) would cost those commands more
than the rest of their start.  A leaf: it imports nothing."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, Tuple


class Record:
    """Fields named by ``_fields``, in order: repr and == as a dataclass
    has them (== only between instances of the same class).  Mutable, so
    unhashable, as a dataclass with eq and without frozen."""

    __slots__ = ()
    _fields: ClassVar[Tuple[str, ...]] = ()
    _hidden: ClassVar[Tuple[str, ...]] = ()  # left out of the repr (dataclass's repr=False)

    def _values(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields
                          if name not in self._hidden)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    if not TYPE_CHECKING:  # (a type checker would refuse FrozenRecord's __hash__)
        __hash__ = None


class FrozenRecord(Record):
    """A Record whose fields are set once, by its __init__ (``_set``):
    assigning or deleting one raises AttributeError, as a frozen
    dataclass's FrozenInstanceError (an AttributeError) does; hashable."""

    __slots__ = ()

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __hash__(self) -> int:
        return hash(self._values())
