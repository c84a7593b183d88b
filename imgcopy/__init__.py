"""imgcopy: copy and convert virtual-disk images fast, moving only what matters."""
from ._core import Error, ImageFormatError
from .extents import Extent, ExtentMap
from .image import Image, map, open

__all__ = ["Error", "ImageFormatError", "Extent", "ExtentMap", "Image", "map", "open"]
__version__ = "0.1.0"
