#!/bin/sh
# Regenerate the journal fuzzer's seed corpus (tests/fuzz/seeds/journal/):
# journals written by csrc/journal.c itself (make_seeds_journal.c), for each
# copy the harness knows (journal_ids.h): empty, an interrupted creation,
# overlapping records, a torn tail.  Needs a C compiler and zlib's headers.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
OUT=${1:-$HERE/seeds/journal}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/imgcopy-seeds-journal.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
${CC:-cc} -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -I"$TOP/csrc" -I"$HERE" \
    -o "$TMP/gen" "$HERE/make_seeds_journal.c" "$TOP/csrc/journal.c" "$TOP/csrc/error.c" -lz
mkdir -p "$OUT"
"$TMP/gen" "$TMP" "$OUT"
ls -l "$OUT"
