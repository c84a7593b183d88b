"""Build the imgcopy._core extension from csrc/.

IMGCOPY_WERROR=1 adds -Werror (CI); IMGCOPY_SANITIZE=1 builds with
AddressSanitizer and UndefinedBehaviorSanitizer (run Python with the ASan
runtime preloaded: `make test-sanitize` does it)."""
import glob
import os

import hashlib

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CORE_SOURCES = sorted(
    p for p in glob.glob("csrc/**/*.c", recursive=True) if not p.startswith("csrc/py/")
)

cflags = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wshadow", "-O2", "-pthread"]
ldflags = ["-pthread"]
if os.environ.get("IMGCOPY_WERROR") == "1":
    cflags.append("-Werror")
if os.environ.get("IMGCOPY_SANITIZE") == "1":
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    cflags = [f for f in cflags if f != "-O2"] + ["-O1", "-g"] + san
    ldflags += san



class BuildExt(build_ext):
    """Objects built with other flags live in another directory, so that a
    sanitizer or -Werror build never links stale objects."""

    def finalize_options(self):
        super().finalize_options()
        tag = hashlib.sha1(" ".join(cflags + ldflags).encode()).hexdigest()[:10]
        self.build_temp = os.path.join(self.build_temp, tag)


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "imgcopy._core",
            sources=CORE_SOURCES + ["csrc/py/module.c"],
            include_dirs=["csrc"],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
            libraries=["z"],
        )
    ],
)
