"""imgcopy: copy and convert virtual-disk images fast, moving only what matters."""
try:
    from . import _program  # first: what a Ctrl-C while the package is imported means
    from .errors import Error, ImageFormatError
    from ._version import __version__
    from .compare import CompareResult, compare
    from .check import CheckResult, check
    from .convert import CopyResult, convert
    from .checksum import ChecksumMismatch, checksum, checksum_algorithms
    from .extents import Extent, ExtentMap
    from .features import features
    from .image import Bitmap, Image, dirty_map, map, open
    from .info import ImageInfo, info
    from .options import CopyOptions, CreateOptions, Qcow2Options, compression_libraries
    from .plan import CopyPlan, Request, plan
    from .measure import MeasureResult, measure
    from .shards import combine_checksums
    from .fleet import Cancelled, CopyJob, copy_many
except KeyboardInterrupt:  # the imgcopy command starting: its exit, not a traceback
    from . import _program  # (again, if the Ctrl-C came while it was imported)
    _program.interrupted_while_starting()
    raise

__all__ = ["Bitmap", "CopyOptions", "CopyPlan", "CopyResult", "CreateOptions", "Error",
           "ImageFormatError", "Extent", "ExtentMap", "Image", "Qcow2Options", "Request",
           "convert", "dirty_map", "map", "open", "plan", "ImageInfo", "info", "__version__",
           "MeasureResult", "measure", "CompareResult", "compare",
           "checksum", "checksum_algorithms", "ChecksumMismatch",
           "CheckResult", "check", "compression_libraries", "features", "combine_checksums",
           "CopyJob", "copy_many", "Cancelled"]
