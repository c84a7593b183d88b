"""What a copy shares with the others of its fleet: the pool of workers it
runs on and its share of the fleet's memory. A context variable, not
convert() keywords: callers of convert() never pass these, copy_many sets
them around each of its copies (each runs in a thread, with its own
context)."""

import contextvars
from collections import namedtuple

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Any, NamedTuple, Optional

    class Sharing(NamedTuple):
        pool: Optional[Any] = None
        buffer_limit: int = 0
else:
    Sharing = namedtuple("Sharing", ["pool", "buffer_limit"], defaults=[None, 0])


SHARING: "contextvars.ContextVar[Sharing]" = contextvars.ContextVar("imgcopy_sharing",
                                                                    default=Sharing())
