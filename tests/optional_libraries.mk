# The optional libraries setup.py builds the core with, found as it finds
# them (a program including the header links with the library), for the
# Makefiles that build the core themselves (tests/c, tests/fuzz).
# IMGCOPY_WITHOUT=libdeflate,zstd leaves them out, as it does for setup.py.
# Sets OPTIONAL_CFLAGS and OPTIONAL_LIBS; include it after setting CC.
comma := ,
optional_without := $(subst $(comma), ,$(IMGCOPY_WITHOUT))
optional_links = $(shell echo 'int main(void) { return 0; }' | \
	$(CC) -x c -include $(1) - -o /dev/null -l$(2) 2>/dev/null && echo yes)

OPTIONAL_CFLAGS :=
OPTIONAL_LIBS :=
ifeq ($(filter libdeflate,$(optional_without)),)
ifeq ($(call optional_links,libdeflate.h,deflate),yes)
OPTIONAL_CFLAGS += -DIMGCOPY_HAVE_LIBDEFLATE=1
OPTIONAL_LIBS += -ldeflate
endif
endif
ifeq ($(filter zstd,$(optional_without)),)
ifeq ($(call optional_links,zstd.h,zstd),yes)
OPTIONAL_CFLAGS += -DIMGCOPY_HAVE_ZSTD=1
OPTIONAL_LIBS += -lzstd
endif
endif
