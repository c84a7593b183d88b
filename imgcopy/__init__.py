"""imgcopy: copy and convert virtual-disk images fast, moving only what matters."""
from ._core import Error, ImageFormatError
from .convert import CopyResult, convert
from .extents import Extent, ExtentMap
from .image import Image, map, open

__all__ = ["CopyResult", "Error", "ImageFormatError", "Extent", "ExtentMap", "Image", "convert",
           "map", "open"]
__version__ = "0.1.0"
