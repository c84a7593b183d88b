/* The VMDK text descriptor: "key = value" lines (version, CID, parentCID,
 * createType, parentFileNameHint, ddb.*), comments, and extent lines
 * ("RW 2048 SPARSE "x-s001.vmdk"", "RW n FLAT "x-flat.vmdk" 0").  Pure
 * functions of untrusted text: lines end with LF or CRLF, any length;
 * numbers are checked for overflow; the extent count is bounded.
 *
 * Where qemu 7.2 silently skips an extent line it cannot use (another
 * access than RW, a ZERO or unknown type, a name without quotes), the disk
 * it opens is smaller than the one the descriptor describes: we refuse
 * such lines instead, naming what we do not read. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vmdk_state.h"

struct line {
    const char *p, *end;
};

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

static void skip_spaces(struct line *l)
{
    while (l->p < l->end && is_space(*l->p))
        l->p++;
}

/* a run of non-space characters */
static size_t word(struct line *l, const char **w)
{
    skip_spaces(l);
    *w = l->p;
    while (l->p < l->end && !is_space(*l->p) && *l->p != '"')
        l->p++;
    return (size_t)(l->p - *w);
}

static int word_is(const char *w, size_t n, const char *s)
{
    return strlen(s) == n && memcmp(w, s, n) == 0;
}

/* a decimal number: 0 with *v, 1 not a number, 2 too large */
static int number(const char *w, size_t n, uint64_t *v)
{
    size_t i = 0;
    if (n && w[0] == '+')
        i++;
    if (i == n)
        return 1;
    uint64_t x = 0;
    for (; i < n; i++) {
        if (w[i] < '0' || w[i] > '9')
            return 1;
        if (x > (UINT64_MAX - 9) / 10)
            return 2;
        x = x * 10 + (uint64_t)(w[i] - '0');
    }
    *v = x;
    return 0;
}

static int bad_line(const struct line *whole, const char *why, const char *path,
                    struct ic_error *err)
{
    int n = (int)(whole->end - whole->p);
    return vmdk_error(err, path, "invalid extent line (%s): %.*s", why, n > 80 ? 80 : n,
                      whole->p);
}

/* (access) (sectors) (type) "name" [offset] */
static int extent_line(struct line l, struct vmdk_desc *d, const char *path,
                       struct ic_error *err)
{
    struct line whole = l;
    const char *w;
    size_t n = word(&l, &w);
    const char *access = w;
    size_t access_n = n;
    uint64_t sectors = 0;
    n = word(&l, &w);
    int r = number(w, n, &sectors);
    if (r == 1)
        return 0; /* not an extent line after all */
    if (!word_is(access, access_n, "RW"))
        return vmdk_error(err, path, "extents with access %.*s are not supported (only RW)",
                          (int)access_n, access);
    if (r == 2 || sectors > (UINT64_C(1) << 54))
        return bad_line(&whole, "size too large", path, err);
    const char *type;
    size_t type_n = word(&l, &type);
    struct vmdk_desc_extent x;
    memset(&x, 0, sizeof x);
    if (word_is(type, type_n, "FLAT"))
        x.type = VMDK_TYPE_FLAT;
    else if (word_is(type, type_n, "SPARSE"))
        x.type = VMDK_TYPE_SPARSE;
    else if (word_is(type, type_n, "VMFS"))
        x.type = VMDK_TYPE_VMFS;
    else if (word_is(type, type_n, "VMFSSPARSE") || word_is(type, type_n, "SESPARSE") ||
             word_is(type, type_n, "ZERO") || word_is(type, type_n, "VMFSRAW") ||
             word_is(type, type_n, "VMFSRDM"))
        return vmdk_error(err, path, "%.*s extents are not supported", (int)type_n, type);
    else
        return vmdk_error(err, path, "unknown extent type '%.*s'",
                          type_n > 32 ? 32 : (int)type_n, type);
    skip_spaces(&l);
    if (l.p >= l.end || *l.p != '"')
        return bad_line(&whole, "no quoted file name", path, err);
    const char *name = ++l.p;
    while (l.p < l.end && *l.p != '"')
        l.p++;
    if (l.p >= l.end)
        return bad_line(&whole, "unterminated file name", path, err);
    size_t name_n = (size_t)(l.p - name);
    l.p++;
    if (name_n > VMDK_NAME_MAX)
        return bad_line(&whole, "file name too long", path, err);
    memcpy(x.name, name, name_n);
    x.name[name_n] = '\0';
    n = word(&l, &w);
    if (x.type == VMDK_TYPE_FLAT) {
        if (!n)
            return bad_line(&whole, "a FLAT extent needs an offset", path, err);
        if (number(w, n, &x.flat_offset) != 0 || x.flat_offset > (UINT64_C(1) << 54))
            return bad_line(&whole, "invalid offset", path, err);
    } else if (n) {
        return bad_line(&whole, "an offset only goes with FLAT", path, err);
    }
    /* qemu skips extents of no sectors */
    if (sectors == 0)
        return 0;
    x.sectors = sectors;
    if (d->nextents >= VMDK_MAX_EXTENTS)
        return vmdk_error(err, path, "more than %u extents", VMDK_MAX_EXTENTS);
    if ((d->nextents & (d->nextents - 1)) == 0) {
        size_t cap = d->nextents ? d->nextents * 2 : 4;
        struct vmdk_desc_extent *p = realloc(d->extents, cap * sizeof *p);
        if (!p)
            return ic_error_nomem(err);
        d->extents = p;
    }
    d->extents[d->nextents++] = x;
    return 0;
}

/* value of `key = value` or `key="value"`, into out (NUL terminated) */
static int value(struct line l, char *out, size_t cap)
{
    skip_spaces(&l);
    if (l.p >= l.end || *l.p != '=')
        return -1;
    l.p++;
    skip_spaces(&l);
    while (l.end > l.p && is_space(l.end[-1]))
        l.end--;
    if (l.p < l.end && *l.p == '"') {
        l.p++;
        const char *q = memchr(l.p, '"', (size_t)(l.end - l.p));
        if (!q)
            return -1;
        l.end = q;
    }
    size_t n = (size_t)(l.end - l.p);
    if (n >= cap)
        return -1;
    memcpy(out, l.p, n);
    out[n] = '\0';
    return 0;
}

static int cid(const char *v, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 16);
    if (end == v || errno || x > UINT32_MAX)
        return -1;
    *out = (uint32_t)x;
    return 0;
}

static int key_line(struct line l, struct vmdk_desc *d, const char *path, struct ic_error *err)
{
    const char *k;
    size_t kn = word(&l, &k);
    /* "key=value" is one word up to '=' */
    const char *eq = memchr(k, '=', kn);
    if (eq) {
        l.p = eq;
        kn = (size_t)(eq - k);
    }
    /* VMware's encrypted disks keep their keys in the descriptor */
    if (kn >= 11 && memcmp(k, "encryption.", 11) == 0)
        return vmdk_error(err, path, "encrypted images are not supported");
    char v[IC_BACKING_NAME_MAX];
    if (word_is(k, kn, "CID") || word_is(k, kn, "parentCID")) {
        int parent = kn != 3;
        if (value(l, v, sizeof v) < 0 || cid(v, parent ? &d->parent_cid : &d->cid) < 0)
            return vmdk_error(err, path, "invalid %s in the descriptor",
                              parent ? "parentCID" : "CID");
        *(parent ? &d->has_parent_cid : &d->has_cid) = 1;
    } else if (word_is(k, kn, "createType")) {
        if (value(l, d->create_type, sizeof d->create_type) < 0)
            return vmdk_error(err, path, "invalid createType in the descriptor");
        d->has_create_type = 1;
    } else if (word_is(k, kn, "parentFileNameHint")) {
        if (value(l, d->parent_hint, sizeof d->parent_hint) < 0)
            return vmdk_error(err, path, "invalid parentFileNameHint in the descriptor");
        d->has_parent_hint = d->parent_hint[0] != '\0';
    }
    return 0;
}

int vmdk_parse_descriptor(const char *text, size_t len, int keys_only, struct vmdk_desc *d,
                          const char *path, struct ic_error *err)
{
    memset(d, 0, sizeof *d);
    const char *nul = memchr(text, '\0', len);
    const char *end = nul ? nul : text + len;
    for (const char *p = text; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        struct line l = {p, nl ? nl : end};
        p = nl ? nl + 1 : end;
        skip_spaces(&l);
        if (l.p >= l.end || *l.p == '#')
            continue;
        int r;
        struct line first = l;
        const char *w;
        size_t n = word(&first, &w);
        if (word_is(w, n, "RW") || word_is(w, n, "RDONLY") || word_is(w, n, "NOACCESS"))
            r = keys_only ? 0 : extent_line(l, d, path, err);
        else
            r = key_line(l, d, path, err);
        if (r < 0) {
            vmdk_desc_free(d);
            return -1;
        }
    }
    return 0;
}

void vmdk_desc_free(struct vmdk_desc *d)
{
    free(d->extents);
    d->extents = NULL;
    d->nextents = 0;
}

int vmdk_check_create_type(const struct vmdk_desc *d, const char *path, struct ic_error *err)
{
    static const char *const readable[] = {"monolithicFlat", "vmfs", "twoGbMaxExtentSparse",
                                           "twoGbMaxExtentFlat"};
    if (!d->has_create_type)
        return vmdk_error(err, path, "invalid VMDK descriptor: no createType");
    for (size_t i = 0; i < sizeof readable / sizeof readable[0]; i++)
        if (strcmp(d->create_type, readable[i]) == 0)
            return 0;
    return vmdk_error(err, path, "unsupported VMDK createType '%.40s'", d->create_type);
}

const char *vmdk_type_name(enum vmdk_extent_type t)
{
    switch (t) {
    case VMDK_TYPE_FLAT:
        return "FLAT";
    case VMDK_TYPE_SPARSE:
        return "SPARSE";
    case VMDK_TYPE_VMFS:
        return "VMFS";
    }
    return "?";
}
