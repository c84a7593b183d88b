"""imgcopy: copy and convert virtual-disk images fast, moving only what matters."""
try:
    from . import _program  # first: what a Ctrl-C while the package is imported means
    from ._version import __version__

    # everything here is in the try: a Ctrl-C may come at any line
    __all__ = ["Bitmap", "CopyOptions", "CopyPlan", "CopyResult", "CreateOptions", "Error",
               "ImageFormatError", "Extent", "ExtentMap", "Image", "Qcow2Options", "Request",
               "convert", "dirty_map", "map", "open", "plan", "ImageInfo", "info", "__version__",
               "MeasureResult", "measure", "CompareResult", "compare",
               "checksum", "checksum_algorithms", "ChecksumMismatch",
               "CheckResult", "check", "compression_libraries", "features",
               "combine_checksums", "CopyJob", "copy_many", "Cancelled"]

    # The public names are imported when first used (PEP 562's module
    # __getattr__): ``import imgcopy`` costs next to nothing, and the command
    # line imports only what the command it runs uses.  name: its module
    _WHERE = {
        "Error": "errors", "ImageFormatError": "errors",
        "CompareResult": "compare", "compare": "compare",
        "CheckResult": "check", "check": "check",
        "CopyResult": "convert", "convert": "convert",
        "ChecksumMismatch": "checksum", "checksum": "checksum", "checksum_algorithms": "checksum",
        "Extent": "extents", "ExtentMap": "extents",
        "features": "features",
        "Bitmap": "image", "Image": "image", "dirty_map": "image", "map": "image",
        "open": "image",
        "ImageInfo": "info", "info": "info",
        "CopyOptions": "options", "CreateOptions": "options", "Qcow2Options": "options",
        "compression_libraries": "options",
        "CopyPlan": "plan", "Request": "plan", "plan": "plan",
        "MeasureResult": "measure", "measure": "measure",
        "combine_checksums": "shards",
        "CopyJob": "fleet", "copy_many": "fleet", "Cancelled": "fleet",
    }

    TYPE_CHECKING = False  # typing's own costs the import it is meant to spare
    if TYPE_CHECKING:  # what a type checker sees: the names as if imported here
        from .errors import Error, ImageFormatError
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
    else:
        def __getattr__(name):
            from importlib import import_module

            where = _WHERE.get(name)
            if where is None:  # a submodule (imgcopy.image, imgcopy._core): as if imported
                if not name.startswith("__"):
                    try:
                        return import_module(f"{__name__}.{name}")
                    except ModuleNotFoundError as exc:
                        if exc.name != f"{__name__}.{name}":
                            raise
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
            value = getattr(import_module(f"{__name__}.{where}"), name)
            globals()[name] = value  # found here from now on, without this call
            return value

        def __dir__():
            return sorted(set(globals()) | set(__all__))

        class _Package(type(_program)):
            """This package's module.  Importing a submodule binds its name here
            (importlib does, once the submodule has run); where a function has
            that name (``imgcopy.info``, ``imgcopy.convert``, ...) the function
            stays, whichever of the two was imported first."""

            def __setattr__(self, name, value):
                if name in _WHERE and isinstance(value, _Package.__base__) and \
                        value.__name__ == f"{__name__}.{name}":
                    return
                super().__setattr__(name, value)

        import sys as _sys
        _sys.modules[__name__].__class__ = _Package
        del _sys
    del TYPE_CHECKING
except BaseException as _e:  # Ctrl-C as the imgcopy command starts: its exit, not a traceback
    from . import _program  # (again, if the Ctrl-C came while it was imported)
    if _program.is_interrupt(_e):
        _program.interrupted_while_starting()
    raise
