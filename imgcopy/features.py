"""What this build of imgcopy has: the optional libraries it was built with
and the ones it loads at run time, as ``imgcopy --version`` lists them.
``imgcopy --version`` imports this and the C core, nothing else of the
package nor typing or argparse."""
from __future__ import annotations

from . import _core
from ._version import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional

# name: (what it brings, Debian/Ubuntu package, Fedora package, whether it
# is linked at build time or loaded at run time); features() has these keys
LIBRARIES = {
    "zlib": ("deflate compression (qcow2, vmdk)", "zlib1g-dev", "zlib-devel", False),
    "libdeflate": ("faster deflate, in place of zlib", "libdeflate-dev", "libdeflate-devel",
                   False),
    "zstd": ("zstd-compressed qcow2", "libzstd-dev", "libzstd-devel", False),
    "libnbd": ("nbd:// URIs", "libnbd0", "libnbd", True),
    "libcrypto": ("checksums", "libssl3", "openssl-libs", True),
}


def features() -> Dict[str, Optional[str]]:
    """The version of each library this build of imgcopy can use, None
    where it lacks it: ``zlib`` (always), ``libdeflate`` and ``zstd``
    (found when it was built), ``libnbd`` and ``libcrypto`` (loaded at run
    time, by this call if not yet)::

        {"zlib": "1.2.13", "libdeflate": "1.14", "zstd": "1.5.4",
         "libnbd": "1.14.2", "libcrypto": "OpenSSL 3.0.11 19 Sep 2023"}
    """
    return _core.library_versions()


def version_text() -> str:
    """What ``imgcopy --version`` prints: the version, then a line per
    library (its version, or what is missing and the package that brings
    it)."""
    found = features()
    lines: List[str] = ["imgcopy " + __version__]
    width = max(len(v or "no") for v in found.values())
    for name, (brings, debian, fedora, run_time) in LIBRARIES.items():
        version = found.get(name)
        if version is not None:
            note = brings + (" (loaded at run time)" if run_time else "")
        else:
            how = "install" if run_time else "rebuild with"
            note = f"{brings}: {how} {debian} (Debian, Ubuntu) or {fedora} (Fedora)"
        lines.append(f"{name:<11}{version or 'no':<{width + 2}}{note}")
    return "\n".join(lines)

