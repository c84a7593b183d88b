"""Keyword arguments that are not there: a TypeError naming the nearest
one that is (``sparse_treshold`` -> did you mean ``sparse_threshold``?).

The public calls take many keywords (convert's are three dozen); a typo's
plain "unexpected keyword argument" leaves the caller to search the
signature.  ``suggest_keywords`` wraps a function, or a class's
``__init__``, and checks the names before the call binds them."""
from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable, Dict, FrozenSet, Iterable, Optional, TypeVar

_T = TypeVar("_T")

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unexpected_keyword(call: str, name: str, valid: Iterable[str]) -> TypeError:
    """Python's own message for an unknown keyword, with the nearest valid
    one (difflib's closest match) when there is one near enough."""
    message = f"{call}() got an unexpected keyword argument {name!r}"
    near = difflib.get_close_matches(name, sorted(valid), n=1)
    if near:
        message += f"; did you mean {near[0]!r}?"
    return TypeError(message)


def _keywords(func: Callable[..., Any]) -> Optional[FrozenSet[str]]:
    """The names ``func`` takes as keywords; None if it takes any (**kw)."""
    params = inspect.signature(func).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in _NAMED)


def _checked(func: Callable[..., Any], call: str) -> Callable[..., Any]:
    valid = _keywords(func)
    if valid is None:
        return func
    # what is suggested: not self, nor the private keywords
    public = [k for k in valid if k != "self" and not k.startswith("_")]

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if kwargs and not valid.issuperset(kwargs):
            unknown = next(k for k in kwargs if k not in valid)
            raise unexpected_keyword(call, unknown, public)
        return func(*args, **kwargs)

    # what introspection reads of the function itself (functools.wraps
    # copies the name, the documentation and the signature's __wrapped__)
    kwdefaults: Optional[Dict[str, Any]] = getattr(func, "__kwdefaults__", None)
    checked.__kwdefaults__ = kwdefaults  # type: ignore[attr-defined]
    return checked


def suggest_keywords(obj: _T) -> _T:
    """``obj`` (a function, or a class: its ``__init__``) raising, for an
    unknown keyword, a TypeError that suggests the nearest valid one."""
    if isinstance(obj, type):
        obj.__init__ = _checked(obj.__init__, obj.__name__)  # type: ignore[misc]
        return obj
    func: Callable[..., Any] = obj  # type: ignore[assignment]
    return _checked(func, func.__name__)  # type: ignore[return-value]
