/* Finding a member of a tar archive: v7, ustar (POSIX and GNU) and pax
 * headers, GNU long names, base-256 sizes.  The archive is hostile input:
 * every header is checksummed, every size checked against the archive's
 * end, and the only allocations (long names, pax records) are bounded by
 * IC_TAR_LONG_MAX.  Each header moves the scan forward by at least one
 * block, so it ends at the end of the file at the latest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../probe.h"
#include "tar.h"

#define BLOCK 512u
#define SEEN_MAX 5 /* member names a "not found" error lists */
#define DISKS_MAX 4 /* disks a refusal of the archive lists */
#define LIST_HEADERS_MAX 4096 /* headers a refusal reads at most */

/* Header fields (offset, length) */
#define F_NAME 0, 100
#define F_SIZE 124, 12
#define F_CHKSUM 148, 8
#define F_TYPE 156
#define F_MAGIC 257
#define F_PREFIX 345, 155
#define GNU_SPARSE_EXTENDED 482 /* old GNU sparse: extension blocks follow */
#define EXT_IS_EXTENDED 504     /* in an extension block: another follows */

struct scan {
    struct ic_image *tar;
    const char *want;
    /* what the headers before a member say of it (GNU 'L', pax 'x') */
    char *long_name;
    char *pax_path;
    int pax_has_size;
    uint64_t pax_size;
    char *pax_sparse_name; /* GNU.sparse.name: a pax-format sparse file */
    int pax_sparse;
    /* pax 'g': defaults for every member after it */
    char *g_path;
    int g_has_size;
    uint64_t g_size;
    /* for the "not found" message */
    char seen[SEEN_MAX][64];
    size_t nseen;
    /* want NULL: every member is probed, the ones that look like disks
     * listed (the first by its whole name) */
    char disks[DISKS_MAX][80];
    size_t ndisks;
    char first_disk[256];
    int first_too_long;
};

static const char *strip_dot_slash(const char *name)
{
    while (name[0] == '.' && name[1] == '/') {
        name += 2;
        while (*name == '/')
            name++;
    }
    return name;
}

/* An octal field as tar writes it (leading spaces, digits, then a space or
 * NUL), or GNU's base-256 (first byte 0x80; 0xff, negative, is refused). */
static int parse_number(const uint8_t *f, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] != 0x80)
            return -1;
        for (size_t i = 1; i < n; i++) {
            if (v >> 56)
                return -1;
            v = v << 8 | f[i];
        }
        *out = v;
        return 0;
    }
    size_t i = 0;
    while (i < n && f[i] == ' ')
        i++;
    size_t digits = 0;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++)
        v = v << 3 | (uint64_t)(f[i] - '0'); /* 12 digits: 36 bits at most */
    if (i < n && f[i] != ' ' && f[i] != '\0')
        return -1;
    if (digits == 0 && i < n && f[i] == ' ')
        return -1; /* spaces only */
    *out = v;
    return 0;
}

/* The checksum field against both sums GNU tar accepts: bytes as
 * unsigned and (historic Unix tars) as signed chars. */
static int checksum_ok(const uint8_t *h)
{
    uint64_t stored;
    if (parse_number(h + 148, 8, &stored) < 0)
        return 0;
    int64_t usum = 0, ssum = 0;
    for (size_t i = 0; i < BLOCK; i++) {
        uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
        usum += c;
        ssum += (int8_t)c;
    }
    return (int64_t)stored == usum || (int64_t)stored == ssum;
}

static int all_zero(const uint8_t *h)
{
    for (size_t i = 0; i < BLOCK; i++)
        if (h[i])
            return 0;
    return 1;
}

static void reset_pending(struct scan *s)
{
    free(s->long_name);
    free(s->pax_path);
    free(s->pax_sparse_name);
    s->long_name = s->pax_path = s->pax_sparse_name = NULL;
    s->pax_has_size = 0;
    s->pax_sparse = 0;
}

static int bad(struct scan *s, struct ic_error *err, uint64_t off, const char *what)
{
    return ic_error_format(err, s->tar->path, "not a usable tar archive: %s at offset %llu",
                           what, (unsigned long long)off);
}

/* A GNU long name or a pax header's records: read whole, NUL-terminated. */
static int read_meta(struct scan *s, uint64_t data, uint64_t size, char **out,
                     struct ic_error *err)
{
    if (size > IC_TAR_LONG_MAX)
        return ic_error_format(err, s->tar->path, "tar extension header of %llu bytes at "
                               "offset %llu is longer than %u bytes", (unsigned long long)size,
                               (unsigned long long)data, IC_TAR_LONG_MAX);
    char *buf = malloc((size_t)size + 1);
    if (!buf)
        return ic_error_nomem(err);
    if (size && ic_image_pread(s->tar, buf, (size_t)size, data, err) < 0) {
        free(buf);
        return -1;
    }
    buf[size] = '\0';
    *out = buf;
    return 0;
}

static int set_text(char **field, const char *value, size_t n, struct ic_error *err)
{
    free(*field);
    *field = NULL;
    if (n == 0) /* pax: an empty value unsets */
        return 0;
    if (!(*field = malloc(n + 1)))
        return ic_error_nomem(err);
    memcpy(*field, value, n);
    (*field)[n] = '\0';
    return 0;
}

static int decimal(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9' || v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    *out = v;
    return 0;
}

/* pax records: "LEN key=value\n", LEN counting the whole record. */
static int parse_pax(struct scan *s, const char *buf, size_t len, int global, uint64_t off,
                     struct ic_error *err)
{
    size_t pos = 0;
    while (pos < len) {
        if (buf[pos] == '\0') /* padding some writers leave */
            break;
        const char *sp = memchr(buf + pos, ' ', len - pos);
        uint64_t rlen;
        if (!sp || decimal(buf + pos, (size_t)(sp - buf - pos), &rlen) < 0 ||
            rlen > len - pos || rlen < (uint64_t)(sp - buf - pos) + 3 ||
            buf[pos + rlen - 1] != '\n')
            return bad(s, err, off, "a malformed pax record");
        const char *key = sp + 1, *end = buf + pos + rlen - 1;
        const char *eq = memchr(key, '=', (size_t)(end - key));
        if (!eq)
            return bad(s, err, off, "a pax record without '='");
        size_t klen = (size_t)(eq - key), vlen = (size_t)(end - eq - 1);
        const char *value = eq + 1;
        if (klen == 4 && memcmp(key, "path", 4) == 0) {
            if (memchr(value, '\0', vlen))
                return bad(s, err, off, "a pax path with a NUL");
            if (set_text(global ? &s->g_path : &s->pax_path, value, vlen, err) < 0)
                return -1;
        } else if (klen == 4 && memcmp(key, "size", 4) == 0) {
            uint64_t v;
            if (decimal(value, vlen, &v) < 0)
                return bad(s, err, off, "a malformed pax size");
            if (global) {
                s->g_has_size = 1;
                s->g_size = v;
            } else {
                s->pax_has_size = 1;
                s->pax_size = v;
            }
        } else if (klen > 11 && memcmp(key, "GNU.sparse.", 11) == 0 && !global) {
            s->pax_sparse = 1;
            if (klen == 15 && memcmp(key + 11, "name", 4) == 0 && !memchr(value, '\0', vlen) &&
                set_text(&s->pax_sparse_name, value, vlen, err) < 0)
                return -1;
        }
        pos += (size_t)rlen;
    }
    return 0;
}

static void note_seen(struct scan *s, const char *name)
{
    if (s->nseen < SEEN_MAX) { /* cut long names: the list is a hint */
        size_t n = strnlen(name, sizeof s->seen[0] - 1);
        memcpy(s->seen[s->nseen], name, n);
        s->seen[s->nseen][n] = '\0';
    }
    s->nseen++;
}

static int not_found(struct scan *s, struct ic_error *err)
{
    char list[300] = "";
    size_t used = 0;
    for (size_t i = 0; i < s->nseen && i < SEEN_MAX; i++) {
        int n = snprintf(list + used, sizeof list - used, "%s'%s'", i ? ", " : "", s->seen[i]);
        if (n < 0 || (size_t)n >= sizeof list - used)
            break;
        used += (size_t)n;
    }
    if (s->nseen == 0)
        return ic_error_value(err, "%s: no member '%s': the archive has no files",
                              s->tar->path, s->want);
    return ic_error_value(err, "%s: no member '%s' in the archive (it has %s%s)", s->tar->path,
                          s->want, list, s->nseen > SEEN_MAX ? ", ..." : "");
}

static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcasecmp(name + n - k, suffix) == 0;
}

/* Listing (want NULL): a regular member's bytes, probed as a disk would be
 * (holes never read). */
static int note_if_disk(struct scan *s, const char *name, uint64_t data, uint64_t size,
                        struct ic_error *err)
{
    uint8_t head[IC_PROBE_HEAD], tail[IC_PROBE_TAIL];
    size_t hlen = size < sizeof head ? (size_t)size : sizeof head, tlen = 0;
    if (ic_image_reads_as_hole(s->tar, data, hlen))
        memset(head, 0, hlen);
    else if (hlen && ic_image_pread(s->tar, head, hlen, data, err) < 0)
        return -1;
    if (size >= sizeof tail &&
        !ic_image_reads_as_hole(s->tar, data + size - sizeof tail, sizeof tail)) {
        if (ic_image_pread(s->tar, tail, sizeof tail, data + size - sizeof tail, err) < 0)
            return -1;
        tlen = sizeof tail;
    }
    const char *fmt = ic_probe_format(head, hlen, tail, tlen);
    if (strcmp(fmt, "tar") == 0 ||
        (strcmp(fmt, "raw") == 0 && !ends_with(name, ".raw") && !ends_with(name, ".img")))
        return 0;
    if (s->ndisks == 0) {
        s->first_too_long = strlen(name) >= sizeof s->first_disk;
        snprintf(s->first_disk, sizeof s->first_disk, "%s", name);
    }
    if (s->ndisks < DISKS_MAX)
        snprintf(s->disks[s->ndisks], sizeof s->disks[0], "'%.60s%s' (%s)", name,
                 strlen(name) > 60 ? "..." : "", fmt);
    s->ndisks++;
    return 0;
}

/* The member's name: pax path, GNU long name, or ustar prefix/name. */
static void member_name(struct scan *s, const uint8_t *h, int posix, char *buf, size_t cap,
                        const char **name)
{
    if (s->pax_path) {
        *name = s->pax_path;
    } else if (s->long_name) {
        *name = s->long_name;
    } else if (s->g_path) {
        *name = s->g_path;
    } else {
        size_t nlen = strnlen((const char *)h, 100);
        size_t plen = posix ? strnlen((const char *)h + 345, 155) : 0;
        if (plen)
            snprintf(buf, cap, "%.*s/%.*s", (int)plen, (const char *)h + 345, (int)nlen,
                     (const char *)h);
        else
            snprintf(buf, cap, "%.*s", (int)nlen, (const char *)h);
        *name = buf;
    }
}

/* Old GNU sparse headers may be followed by extension blocks before the
 * data: where the data starts. */
static int skip_sparse_extensions(struct scan *s, const uint8_t *h, uint64_t *data,
                                  struct ic_error *err)
{
    uint8_t ext[BLOCK];
    int more = h[GNU_SPARSE_EXTENDED] != 0;
    while (more) {
        if (s->tar->size < BLOCK || *data > s->tar->size - BLOCK)
            return bad(s, err, *data, "the archive ends inside a sparse header");
        if (ic_image_pread(s->tar, ext, BLOCK, *data, err) < 0)
            return -1;
        more = ext[EXT_IS_EXTENDED] != 0;
        *data += BLOCK;
    }
    return 0;
}

static int scan(struct scan *s, struct ic_tar_member *out, struct ic_error *err)
{
    uint8_t h[BLOCK];
    char ustar_name[100 + 1 + 155 + 1];
    uint64_t off = 0, total = s->tar->size;
    unsigned headers = 0;
    for (;;) {
        if (off >= total) /* no end-of-archive blocks: tar tools accept it */
            return s->want ? not_found(s, err) : 0;
        if (!s->want && headers++ >= LIST_HEADERS_MAX)
            return 0;
        if (total - off < BLOCK)
            return bad(s, err, off, "a truncated header");
        if (ic_image_pread(s->tar, h, BLOCK, off, err) < 0)
            return -1;
        if (all_zero(h))
            return s->want ? not_found(s, err) : 0;
        if (!checksum_ok(h))
            return bad(s, err, off, "a header with a bad checksum");
        uint8_t type = h[F_TYPE];
        int posix = memcmp(h + F_MAGIC, "ustar\0", 6) == 0;
        uint64_t size;
        if (parse_number(h + 124, 12, &size) < 0)
            return bad(s, err, off, "a header with a malformed size");
        int meta = type == 'L' || type == 'K' || type == 'x' || type == 'g';
        if (!meta && s->pax_has_size)
            size = s->pax_size;
        else if (!meta && s->g_has_size)
            size = s->g_size;
        uint64_t data = off + BLOCK;
        if (type == 'S' && skip_sparse_extensions(s, h, &data, err) < 0)
            return -1;
        /* links, devices, directories and FIFOs hold no data (as Python's
         * tarfile reads them) */
        if (type >= '1' && type <= '6')
            size = 0;
        const char *name = "";
        if (!meta)
            member_name(s, h, posix, ustar_name, sizeof ustar_name, &name);
        int wanted = !meta && type != 'V' && s->want &&
                     (strcmp(strip_dot_slash(name), s->want) == 0 ||
                      (s->pax_sparse_name &&
                       strcmp(strip_dot_slash(s->pax_sparse_name), s->want) == 0));
        if (size > total - data) {
            if (wanted)
                return ic_error_format(err, s->tar->path, "member '%s' (%llu bytes at offset "
                                       "%llu) extends past the end of the archive", s->want,
                                       (unsigned long long)size, (unsigned long long)data);
            return bad(s, err, off, "a member extending past the end of the archive");
        }
        uint64_t next = data + (size + BLOCK - 1) / BLOCK * BLOCK; /* <= total + 511 */
        if (type == 'L' || type == 'x' || type == 'g') {
            char *buf = NULL;
            if (read_meta(s, data, size, &buf, err) < 0)
                return -1;
            int r = 0;
            if (type == 'L') {
                free(s->long_name);
                s->long_name = buf;
                buf = NULL;
            } else {
                r = parse_pax(s, buf, (size_t)size, type == 'g', off, err);
            }
            free(buf);
            if (r < 0)
                return -1;
        } else if (type == 'K') {
            if (size > IC_TAR_LONG_MAX)
                return bad(s, err, off, "a GNU long link name longer than 64 KiB");
        } else if (wanted) {
            if (type == 'S' || s->pax_sparse)
                return ic_error_format(err, s->tar->path, "member '%s' is a GNU sparse file, "
                                       "which imgcopy cannot read in place", s->want);
            if (type != '0' && type != '\0' && type != '7')
                return ic_error_value(err, "%s: member '%s' is not a regular file (tar type "
                                      "'%c')", s->tar->path, s->want,
                                      type >= 0x20 && type < 0x7f ? type : '?');
            out->data_offset = data;
            out->size = size;
            return 0;
        } else {
            const char *shown = strip_dot_slash(s->pax_sparse_name ? s->pax_sparse_name : name);
            if (type != 'V' && type != '5')
                note_seen(s, shown);
            if (!s->want && (type == '0' || type == '\0' || type == '7') && !s->pax_sparse &&
                note_if_disk(s, shown, data, size, err) < 0)
                return -1;
            reset_pending(s);
        }
        off = next;
    }
}

int ic_tar_find(struct ic_image *tar, const char *member, struct ic_tar_member *out,
                struct ic_error *err)
{
    struct scan s = {.tar = tar, .want = strip_dot_slash(member)};
    if (!s.want[0])
        return ic_error_value(err, "%s: an empty member name", tar->path);
    int r = scan(&s, out, err);
    reset_pending(&s);
    free(s.g_path);
    return r;
}

int ic_tar_refuse_as_disk(struct ic_image *tar, const char *path, const char *member,
                          struct ic_error *err)
{
    struct scan s = {.tar = tar};
    struct ic_error scan_err = {0};
    int r = scan(&s, NULL, &scan_err);
    reset_pending(&s);
    free(s.g_path);
    /* an archive corrupt past its first header is refused all the same,
     * with what was read of it */
    if (r < 0 && scan_err.kind != IC_ERR_FORMAT) {
        if (err)
            *err = scan_err;
        return -1;
    }
    char list[DISKS_MAX * 84 + 8] = "";
    size_t used = 0;
    size_t nlist = s.ndisks ? s.ndisks : s.nseen, cap = s.ndisks ? DISKS_MAX : SEEN_MAX;
    for (size_t i = 0; i < nlist && i < cap; i++) {
        int n = s.ndisks ? snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                    s.disks[i])
                         : snprintf(list + used, sizeof list - used, "%s'%s'", i ? ", " : "",
                                    s.seen[i]);
        if (n < 0 || (size_t)n >= sizeof list - used)
            break;
        used += (size_t)n;
    }
    const char *more = nlist > cap ? ", ..." : "";
    char what[300];
    if (member)
        snprintf(what, sizeof what, "member '%.200s' is a tar archive itself", member);
    else
        snprintf(what, sizeof what, "a tar archive (an OVA?)");
    if (s.ndisks)
        ic_error_format(err, path, "%s, not a disk image; the members that look like disks: "
                        "%s%s", what, list, more);
    else if (s.nseen)
        ic_error_format(err, path, "%s, not a disk image, and none of its members looks like "
                        "a disk (it has %s%s)", what, list, more);
    else
        ic_error_format(err, path, "%s, not a disk image, and it holds no files", what);
    /* member= reads one level of archive only */
    if (s.ndisks && !member && !s.first_too_long)
        return ic_error_remedy_member(err, s.first_disk);
    return ic_error_remedy(err, IC_REMEDY_AS_RAW);
}
