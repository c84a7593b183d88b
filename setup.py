"""Build the imgcopy._core extension from csrc/.

IMGCOPY_WERROR=1 adds -Werror (CI); IMGCOPY_SANITIZE=1 builds with
AddressSanitizer and UndefinedBehaviorSanitizer (run Python with the ASan
runtime preloaded: `make test-sanitize` does it)."""
import glob
import os

from setuptools import Extension, setup

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

setup(
    ext_modules=[
        Extension(
            "imgcopy._core",
            sources=CORE_SOURCES + ["csrc/py/module.c"],
            include_dirs=["csrc"],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
        )
    ],
)
