"""Whether an exception is a Ctrl-C: for the command's entry (_program) and
its command line (cli), which answer one with ``imgcopy: interrupted``.
Imports nothing."""


def is_interrupt(e: BaseException) -> bool:
    """A KeyboardInterrupt, or an error it caused: Python 3.11 turns one that
    lands in a ``__set_name__`` (a dataclass being made as a module is
    imported) into a RuntimeError whose cause it is."""
    for _ in range(8):
        if isinstance(e, KeyboardInterrupt):
            return True
        if e.__cause__ is None:
            return False
        e = e.__cause__
    return False
