"""The command's dataclasses without ``inspect``: importing ``dataclasses``
imports ``inspect`` (with ast, dis, tokenize: ~7 ms, a fifth of a copy
command's start), which dataclasses uses only to write the docstring of a
class that has none.  The command's own process (never a program that
imports imgcopy: its modules are its own) imports dataclasses with a
stand-in for inspect that loads the real module on first use; once
dataclasses is imported, ``import inspect`` anywhere gets the real module
as before."""

import sys
import types


class _InspectOnDemand(types.ModuleType):
    """dataclasses' ``inspect`` until an attribute is asked for: then the
    real module, which replaces the stand-in in dataclasses too."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # the import machinery's questions
            raise AttributeError(name)
        if sys.modules.get("inspect") is self:  # asked while dataclasses imports
            del sys.modules["inspect"]
        import inspect

        dataclasses = sys.modules.get("dataclasses")
        if dataclasses is not None and getattr(dataclasses, "inspect", None) is self:
            setattr(dataclasses, "inspect", inspect)
        return getattr(inspect, name)


def import_dataclasses() -> None:
    """Imports dataclasses, inspect left for later unless it is loaded."""
    if "dataclasses" in sys.modules or "inspect" in sys.modules:
        return
    stand_in = _InspectOnDemand("inspect")
    sys.modules["inspect"] = stand_in
    try:
        import dataclasses  # noqa: F401
    finally:
        if sys.modules.get("inspect") is stand_in:
            del sys.modules["inspect"]
