# The optional libraries setup.py builds the core with, found as it finds
# them (a program including the header links with the library), for the
# Makefiles that build the core themselves (tests/c, tests/fuzz).
# IMGCOPY_WITHOUT=libdeflate,zstd leaves them out, and IMGCOPY_REQUIRE makes
# a missing one an error, as they do for setup.py.
# Sets OPTIONAL_CFLAGS and OPTIONAL_LIBS; include it after setting CC.
comma := ,
optional_without := $(subst $(comma), ,$(IMGCOPY_WITHOUT))
optional_require := $(subst $(comma), ,$(IMGCOPY_REQUIRE))
ifneq ($(filter-out libdeflate zstd,$(optional_without) $(optional_require)),)
$(error unknown optional libraries: $(filter-out libdeflate zstd,$(optional_without) $(optional_require)) (known: libdeflate zstd))
endif
ifneq ($(filter $(optional_without),$(optional_require)),)
$(error IMGCOPY_WITHOUT and IMGCOPY_REQUIRE both name $(filter $(optional_without),$(optional_require)))
endif
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
ifneq ($(filter libdeflate,$(optional_require)),)
ifeq ($(findstring LIBDEFLATE,$(OPTIONAL_CFLAGS)),)
$(error IMGCOPY_REQUIRE: libdeflate not found: install libdeflate-dev (Debian, Ubuntu) or libdeflate-devel (Fedora))
endif
endif
ifneq ($(filter zstd,$(optional_require)),)
ifeq ($(findstring ZSTD,$(OPTIONAL_CFLAGS)),)
$(error IMGCOPY_REQUIRE: zstd not found: install libzstd-dev (Debian, Ubuntu) or libzstd-devel (Fedora))
endif
endif
