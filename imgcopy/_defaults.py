"""The names and defaults both the API and the command line's registration
need (its choices, its --help): a leaf that imports the C core alone, so
that registering the commands imports none of what runs them."""
from . import _core

# the formats the C core reads (csrc/registry.c)
FORMATS = _core.formats()
# the formats the C core writes, and "null", the null target's name
DEST_FORMATS = _core.writable_formats() + ("null",)
# CopyOptions' defaults, the C core's
COPY_DEFAULTS = _core.copy_option_defaults()
# checksums: blksum's digest and block size
DEFAULT_ALGORITHM = "sha256"
DEFAULT_BLOCK_SIZE = 65536
# convert(journal=)'s checkpoints: every this many seconds
JOURNAL_INTERVAL = 5.0
