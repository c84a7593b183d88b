"""Build the imgcopy._core extension from csrc/.

IMGCOPY_WERROR=1 adds -Werror (CI); IMGCOPY_SANITIZE=1 builds with
AddressSanitizer and UndefinedBehaviorSanitizer (run Python with the ASan
runtime preloaded: `make test-sanitize` does it).

`pip install -e .` builds the extension in place (imgcopy/_core*.so), so
that the checkout itself imports what was built, from anywhere.

Optional libraries, used when their headers are found (Debian packages in
brackets): libdeflate [libdeflate-dev] compresses and inflates qcow2's
deflate clusters faster than zlib; libzstd [libzstd-dev] reads and writes
zstd-compressed qcow2.  The build prints which it found and which are
missing; IMGCOPY_REQUIRE=libdeflate,zstd makes a missing one an error, and
IMGCOPY_WITHOUT=libdeflate,zstd builds without them even where they are
installed (unknown names are errors in both)."""
import glob
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
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


# name: (header, library, the macro the core tests, what it brings,
#        Debian/Ubuntu package, Fedora package)
OPTIONAL_LIBRARIES = {
    "libdeflate": ("libdeflate.h", "deflate", "IMGCOPY_HAVE_LIBDEFLATE",
                   "faster deflate (qcow2, vmdk); without it zlib does it",
                   "libdeflate-dev", "libdeflate-devel"),
    "zstd": ("zstd.h", "zstd", "IMGCOPY_HAVE_ZSTD",
             "zstd-compressed qcow2; without it such images are refused",
             "libzstd-dev", "libzstd-devel"),
}
# loaded at run time (dlopen): not needed to build, named in the summary
RUN_TIME_LIBRARIES = {"libnbd": ("nbd:// URIs", "libnbd0", "libnbd"),
                      "libcrypto": ("checksums", "libssl3", "openssl-libs")}


def named(variable: str) -> set:
    """The optional libraries an environment variable names (IMGCOPY_WITHOUT,
    IMGCOPY_REQUIRE: comma-separated); an unknown name is an error."""
    names = {n.strip() for n in os.environ.get(variable, "").split(",") if n.strip()}
    unknown = names - set(OPTIONAL_LIBRARIES)
    if unknown:
        sys.exit(f"{variable}: unknown {', '.join(sorted(unknown))} "
                 f"(known: {', '.join(OPTIONAL_LIBRARIES)})")
    return names


WITHOUT, REQUIRE = named("IMGCOPY_WITHOUT"), named("IMGCOPY_REQUIRE")
if WITHOUT & REQUIRE:
    sys.exit(f"IMGCOPY_WITHOUT and IMGCOPY_REQUIRE both name {', '.join(sorted(WITHOUT & REQUIRE))}")


def links(header: str, library: str) -> bool:
    """Whether a program that includes `header` links with -l`library`."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(f"#include <{header}>\nint main(void) {{ return 0; }}\n")
        result = subprocess.run(cc + [source, "-o", os.path.join(tmp, "probe"), "-l" + library],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return result.returncode == 0


def optional_libraries():
    """(macros, libraries) of the optional libraries this build uses.
    Prints what was found and what is missing (with the packages that bring
    it); a missing library IMGCOPY_REQUIRE names is an error."""
    macros, libraries, lines, required_missing = [], [], [], []
    for name, (header, library, macro, brings, debian, fedora) in OPTIONAL_LIBRARIES.items():
        install = f"{debian} (Debian, Ubuntu) or {fedora} (Fedora)"
        if name in WITHOUT:
            lines.append(f"  {name:<11} left out  (IMGCOPY_WITHOUT): {brings}")
        elif links(header, library):
            macros.append((macro, "1"))
            libraries.append(library)
            lines.append(f"  {name:<11} found     {brings}")
        else:
            lines.append(f"  {name:<11} MISSING   {brings}; install {install} and rebuild")
            if name in REQUIRE:
                required_missing.append(f"{name} ({header} or -l{library} not found): "
                                        f"install {install}")
    for name, (brings, debian, fedora) in RUN_TIME_LIBRARIES.items():
        lines.append(f"  {name:<11} run time  {brings}: loaded when used "
                     f"({debian} or {fedora}), not needed to build")
    print("imgcopy: optional libraries (`imgcopy --version` lists what a build has; "
          "IMGCOPY_REQUIRE=libdeflate,zstd makes a missing one an error):\n" + "\n".join(lines),
          file=sys.stderr)
    if required_missing:
        sys.exit("imgcopy: IMGCOPY_REQUIRE names a library that is missing: "
                 + "; ".join(required_missing))
    return macros, libraries


class BuildExt(build_ext):
    """Objects built with other flags live in another directory, so that a
    sanitizer or -Werror build never links stale objects; a change of flags
    rebuilds the extension although its sources are older; the sources
    compile in parallel."""

    def run(self):
        # here, not at import: only a build looks for the optional libraries
        # (an sdist does not), and looks once
        if not hasattr(self, "flags_tag"):
            macros, libraries = optional_libraries()
            optional = [f"-D{name}={value}" for name, value in macros]
            for ext in self.extensions:
                ext.extra_compile_args = cflags + optional
                ext.libraries = ["z"] + libraries
            flags = " ".join(cflags + optional + ldflags)
            self.flags_tag = hashlib.sha1(flags.encode()).hexdigest()[:10]
            self.build_temp = os.path.join(self.build_temp, self.flags_tag)
        super().run()

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
            extra_compile_args=cflags,  # and the optional libraries' (BuildExt.run)
            extra_link_args=ldflags,
            libraries=["z"],
        )
    ],
)
