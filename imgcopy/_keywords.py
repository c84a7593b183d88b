"""Keyword arguments that are not there: a TypeError naming the nearest
one that is (``sparse_treshold`` -> did you mean ``sparse_threshold``?).

The public calls take many keywords (convert's are three dozen); a typo's
plain "unexpected keyword argument" leaves the caller to search the
signature.  ``suggest_keywords`` wraps a function, or a class's
``__init__``, and checks the names before the call binds them.

The names are read from the function's code object, not from
inspect.signature(): every public module is decorated with this, so what it
imports (inspect: ast, dis, tokenize, ...) every command would import."""
from __future__ import annotations

import functools

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, FrozenSet, Iterable, Optional, TypeVar

    _T = TypeVar("_T")

_CO_VARKEYWORDS = 0x08  # inspect.CO_VARKEYWORDS: the function takes **kwargs


def unexpected_keyword(call: str, name: str, valid: Iterable[str]) -> TypeError:
    """Python's own message for an unknown keyword, with the nearest valid
    one (difflib's closest match) when there is one near enough."""
    import difflib

    message = f"{call}() got an unexpected keyword argument {name!r}"
    near = difflib.get_close_matches(name, sorted(valid), n=1)
    if near:
        message += f"; did you mean {near[0]!r}?"
    return TypeError(message)


def _keywords(func: Callable[..., Any]) -> Optional[FrozenSet[str]]:
    """The names ``func`` takes as keywords; None if it takes any (**kw)."""
    code = getattr(func, "__code__", None)
    if code is None or hasattr(func, "__wrapped__") or hasattr(func, "__signature__"):
        return _keywords_of_signature(func)  # not a plain function: as inspect sees it
    if code.co_flags & _CO_VARKEYWORDS:
        return None
    # positional-only first, then positional-or-keyword, then keyword-only
    return frozenset(code.co_varnames[code.co_posonlyargcount:
                                      code.co_argcount + code.co_kwonlyargcount])


def _keywords_of_signature(func: Callable[..., Any]) -> Optional[FrozenSet[str]]:
    import inspect

    params = inspect.signature(func).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params if p.kind in named)


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
