"""Build the imgcopy._core extension from csrc/.

IMGCOPY_WERROR=1 adds -Werror (CI); IMGCOPY_SANITIZE=1 builds with
AddressSanitizer and UndefinedBehaviorSanitizer (run Python with the ASan
runtime preloaded: `make test-sanitize` does it).

`pip install -e .` builds the extension in place (imgcopy/_core*.so), so
that the checkout itself imports what was built, from anywhere."""
import glob
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CORE_SOURCES = sorted(
    p for p in glob.glob("csrc/**/*.c", recursive=True) if not p.startswith("csrc/py/")
)
# a header edit rebuilds the extension
HEADERS = sorted(glob.glob("csrc/**/*.h", recursive=True))

cflags = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wshadow", "-O2", "-pthread",
          # only PyInit__core is exported: the core's symbols stay inside
          "-fvisibility=hidden"]
ldflags = ["-pthread"]
if os.environ.get("IMGCOPY_WERROR") == "1":
    cflags.append("-Werror")
if os.environ.get("IMGCOPY_SANITIZE") == "1":
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    cflags = [f for f in cflags if f != "-O2"] + ["-O1", "-g"] + san
    ldflags += san


class BuildExt(build_ext):
    """Objects built with other flags live in another directory, so that a
    sanitizer or -Werror build never links stale objects; a change of flags
    rebuilds the extension although its sources are older; the sources
    compile in parallel."""

    def finalize_options(self):
        super().finalize_options()
        self.flags_tag = hashlib.sha1(" ".join(cflags + ldflags).encode()).hexdigest()[:10]
        self.build_temp = os.path.join(self.build_temp, self.flags_tag)

    def build_extension(self, ext):
        # where the flags of the library at `target` are recorded
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        stamp = os.path.join(os.path.dirname(self.build_temp),
                             hashlib.sha1(target.encode()).hexdigest()[:10] + ".flags")
        try:
            with open(stamp) as f:
                self.force = self.force or f.read() != self.flags_tag
        except OSError:
            self.force = True
        compiler = self.compiler
        serial_compile = compiler.compile

        def parallel_compile(sources, *args, **kwargs):
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                parts = pool.map(lambda s: serial_compile([s], *args, **kwargs), sources)
                return [obj for objs in parts for obj in objs]

        compiler.compile = parallel_compile
        try:
            super().build_extension(ext)
        finally:
            compiler.compile = serial_compile
        os.makedirs(os.path.dirname(stamp) or ".", exist_ok=True)
        with open(stamp, "w") as f:
            f.write(self.flags_tag)


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "imgcopy._core",
            sources=CORE_SOURCES + sorted(glob.glob("csrc/py/*.c")),
            depends=HEADERS,
            include_dirs=["csrc"],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
            libraries=["z"],
        )
    ],
)
