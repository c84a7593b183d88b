"""imgcopy: copy and convert virtual-disk images fast, moving only what matters."""
from .errors import Error, ImageFormatError
from ._version import __version__
from .check import CheckResult, check
from .convert import CopyResult, convert
from .extents import Extent, ExtentMap
from .image import Image, map, open
from .info import ImageInfo, info
from .options import CopyOptions, CreateOptions, Qcow2Options
from .plan import CopyPlan, Request, plan

__all__ = ["CopyOptions", "CopyPlan", "CopyResult", "CreateOptions", "Error",
           "ImageFormatError", "Extent", "ExtentMap", "Image", "Qcow2Options", "Request",
           "check", "CheckResult", "convert", "map", "open", "plan", "ImageInfo", "info", "__version__"]
