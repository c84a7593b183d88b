"""What this build of imgcopy was compiled with (optional libraries)."""
import imgcopy

LIBRARIES = imgcopy.compression_libraries()
HAVE_ZSTD = LIBRARIES["zstd"] is not None
HAVE_LIBDEFLATE = (LIBRARIES["zlib"] or "").startswith("libdeflate")
