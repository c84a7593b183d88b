"""NBD URIs (``nbd://host[:port]/export``, ``nbd+unix:///export?socket=PATH``,
``nbds://...``) where a path goes, and the name qemu shows for them."""
from __future__ import annotations

TYPE_CHECKING = False  # typing's import is not paid to start a command
if TYPE_CHECKING:
    from typing import Union

NBD_SCHEMES = ("nbd", "nbds", "nbd+unix", "nbds+unix", "nbd+vsock", "nbds+vsock")
NBD_DEFAULT_PORT = 10809


def is_nbd_uri(name: Union[str, bytes]) -> bool:
    """Whether ``name`` is an NBD URI rather than a file's name."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    scheme, sep, _ = name.partition("://")
    return bool(sep) and scheme in NBD_SCHEMES


def qemu_filename(name: str) -> str:
    """The name qemu-img prints for an image: an NBD URI as qemu spells it
    again (``nbd+unix://?socket=PATH``, ``nbd://HOST:PORT/EXPORT``), any
    other name as it is."""
    if not is_nbd_uri(name):
        return name
    from urllib.parse import parse_qs, unquote, urlsplit  # only for URIs: start-up time

    uri = urlsplit(name)
    export = unquote(uri.path[1:] if uri.path.startswith("/") else uri.path)
    tail = "/" + export if export else ""
    if uri.scheme.endswith("+unix"):
        sockets = parse_qs(uri.query).get("socket")
        if not sockets:
            return name
        return "nbd+unix://%s?socket=%s" % ("/" + export if export else "", sockets[0])
    if uri.scheme.endswith("+vsock") or not uri.hostname or ":" in uri.hostname:
        return name  # qemu shows no pseudo-filename for these
    return "nbd://%s:%s%s" % (uri.hostname, uri.port or NBD_DEFAULT_PORT, tail)
