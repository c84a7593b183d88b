"""imgcopy: copy and convert virtual-disk images fast, moving only what matters."""
from .errors import Error, ImageFormatError
from ._version import __version__
from .convert import CopyResult, convert
from .extents import Extent, ExtentMap
from .image import Image, map, open
from .info import ImageInfo, info
from .plan import CopyPlan, Request, plan

__all__ = ["CopyPlan", "CopyResult", "Error", "ImageFormatError", "Extent", "ExtentMap", "Image",
           "Request", "convert", "map", "open", "plan", "ImageInfo", "info", "__version__"]
