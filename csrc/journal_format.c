/* The journal's bytes (layout in journal.h): its header and a record
 * encoded, and a file read back.  What is read is hostile until checked:
 * lengths are weighed against the file before anything is allocated for
 * them, and damage is told here a torn tail (dropped) or damage in the
 * middle (refused), so that the index only ever meets whole records whose
 * ranges, bitmap and digests add up. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "journal_internal.h"

static const uint8_t MAGIC[8] = {'I', 'C', 'J', 'R', 'N', 'L', '\r', '\n'};
#define FIXED 52u      /* the header before its texts */
#define REC_HEADER 16u /* a record's length and checksums */
#define PAYLOAD_MIN 8u /* count and flags */
/* Damage in the middle is found by looking for a whole record after it;
 * a hostile file could make each offset look like a record header: give up
 * (and refuse) after this many that fail their payload's checksum. */
#define SCAN_CANDIDATES 64

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

/* zlib's crc32 takes an unsigned int length: feed it in pieces */
static uint32_t crc_add(uint32_t crc, const uint8_t *p, size_t n)
{
    uLong c = crc;
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

static uint32_t crc(const uint8_t *p, size_t n)
{
    return crc_add((uint32_t)crc32(0L, Z_NULL, 0), p, n);
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* Read up to n bytes at off: how many (fewer only at the end of the file), or -1 */
static ssize_t read_at(int fd, uint8_t *p, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        size_t k = n - got > (1u << 30) ? (1u << 30) : n - got;
        ssize_t r = pread(fd, p + got, k, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* `text` (n bytes, hostile when from a file) for a message: printable
 * ASCII as is, other bytes escaped; when long, the part around byte `at`
 * (where two values start to differ) with "..." for what is left out. */
static void shorten(const char *text, size_t n, size_t at, char *out, size_t cap)
{
    enum { BEFORE = 24, SHOWN = 72 };
    size_t start = n > SHOWN && at > BEFORE ? at - BEFORE : 0;
    if (n > SHOWN && start > n - SHOWN)
        start = n - SHOWN;
    size_t stop = n - start > SHOWN ? start + SHOWN : n;
    size_t o = 0;
    if (start > 0)
        o += (size_t)snprintf(out + o, cap - o, "...");
    for (size_t i = start; i < stop && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    if (stop < n && o + 4 < cap)
        o += (size_t)snprintf(out + o, cap - o, "...");
    out[o < cap ? o : cap - 1] = '\0';
}

uint8_t *journal_build_header(const struct ic_journal_identity *id, size_t *len)
{
    const char *text[4] = {id->algorithm ? id->algorithm : "", id->source ? id->source : "",
                           id->destination ? id->destination : "",
                           id->options ? id->options : ""};
    size_t tl[4], h = FIXED + 4;
    for (int i = 0; i < 4; i++) {
        tl[i] = strlen(text[i]);
        h += tl[i];
    }
    uint8_t *b = malloc(h);
    if (!b)
        return NULL;
    memcpy(b, MAGIC, 8);
    put32(b + 8, IC_JOURNAL_VERSION);
    put32(b + 12, (uint32_t)h);
    put64(b + 16, id->size);
    put64(b + 24, id->block_size);
    put32(b + 32, (uint32_t)id->digest_size);
    size_t o = FIXED;
    for (int i = 0; i < 4; i++) {
        put32(b + 36 + 4 * i, (uint32_t)tl[i]);
        memcpy(b + o, text[i], tl[i]);
        o += tl[i];
    }
    put32(b + o, crc(b, o));
    *len = h;
    return b;
}

/* Whether the file (p[0..n), all of it) is the start of the header `ours`
 * (h bytes) that a crash interrupted: a part of it, maybe followed by
 * zeros (a size that reached the disk before the data), but not all of it.
 * Only our own header: a damaged journal, or one another copy began, is
 * refused rather than written over. */
static int torn_creation(const uint8_t *p, size_t n, const uint8_t *ours, size_t h)
{
    if (n > h)
        return 0;
    size_t same = 0;
    while (same < n && p[same] == ours[same])
        same++;
    return same < h && all_zero(p + same, n - same);
}

#define CORRUPT(...) ic_error_format(err, j->path, "corrupt journal " __VA_ARGS__)

static int check_identity(struct ic_journal *j, const uint8_t *p, uint32_t h,
                          const struct ic_journal_identity *id, struct ic_error *err)
{
    const char *names[4] = {"digest algorithm", "source", "destination", "options"};
    const char *ours[4] = {id->algorithm ? id->algorithm : "", id->source ? id->source : "",
                           id->destination ? id->destination : "",
                           id->options ? id->options : ""};
    const char *theirs[4];
    size_t tl[4];
    uint64_t o = FIXED;
    for (int i = 0; i < 4; i++) {
        tl[i] = get32(p + 36 + 4 * i);
        if (tl[i] > IC_JOURNAL_TEXT_MAX || o + tl[i] > (uint64_t)h - 4)
            return CORRUPT("header: text %d is %zu bytes long", i, tl[i]);
        theirs[i] = (const char *)p + o;
        o += tl[i];
    }
    if (o != (uint64_t)h - 4)
        return CORRUPT("header: %u bytes, its texts end at %llu", h, (unsigned long long)o);
    char where[80], a[180], b[180];
    shorten(j->path, strlen(j->path), strlen(j->path), where, sizeof where);
    /* the texts first: a journal of another copy is told by its source
     * or destination rather than by a size that follows from them */
    static const int order[4] = {1, 2, 3, 0};
    for (int k = 0; k < 4; k++) {
        int i = order[k];
        size_t n = strlen(ours[i]);
        if (n == tl[i] && memcmp(ours[i], theirs[i], n) == 0)
            continue;
        size_t at = 0;
        while (at < n && at < tl[i] && ours[i][at] == theirs[i][at])
            at++;
        if (i == 0) {
            snprintf(a, sizeof a, "%s", tl[0] ? "" : "none");
            snprintf(b, sizeof b, "%s", n ? "" : "none");
        } else {
            a[0] = b[0] = '\0';
        }
        if (!a[0])
            shorten(theirs[i], tl[i], at, a, sizeof a);
        if (!b[0])
            shorten(ours[i], n, at, b, sizeof b);
        return ic_error_value(err, "journal %s belongs to another copy: its %s is '%s', this "
                              "copy's '%s'", where, names[i], a, b);
    }
    const char *nnames[3] = {"size", "block size", "digest size"};
    uint64_t nt[3] = {get64(p + 16), get64(p + 24), get32(p + 32)};
    uint64_t no[3] = {id->size, id->block_size, id->digest_size};
    for (int i = 0; i < 3; i++)
        if (nt[i] != no[i])
            return ic_error_value(err, "journal %s belongs to another copy: its %s is %llu, "
                                  "this copy's %llu", where, nnames[i],
                                  (unsigned long long)nt[i], (unsigned long long)no[i]);
    return 0;
}

/* Whether a whole record starts somewhere in (from, fsize): then what is
 * damaged at `from` is in the middle of the journal, not its torn tail. */
static int whole_record_after(struct ic_journal *j, uint64_t from, uint64_t fsize, int *found,
                              struct ic_error *err)
{
    *found = 0;
    /* a window as long as what is left, at most WINDOW: a torn tail is
     * usually a few bytes */
    enum { WINDOW = 1 << 20 };
    size_t cap = fsize - from < WINDOW ? (size_t)(fsize - from) : WINDOW;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf)
        return ic_error_nomem(err);
    int candidates = 0, ret = 0;
    uint64_t at = from + 1;
    while (at + REC_HEADER <= fsize && !*found && ret == 0) {
        size_t want = fsize - at < cap ? (size_t)(fsize - at) : cap;
        ssize_t got = read_at(j->fd, buf, want, at);
        if (got < 0) {
            ret = ic_error_os(err, errno, j->path, "cannot read the journal");
            break;
        }
        if ((size_t)got < REC_HEADER)
            break;
        size_t i;
        for (i = 0; i + REC_HEADER <= (size_t)got; i++) {
            const uint8_t *hd = buf + i;
            uint64_t len = get64(hd), pos = at + i;
            /* the length first: it rules out most offsets without a checksum */
            if (len < PAYLOAD_MIN || len > fsize - pos - REC_HEADER || crc(hd, 12) != get32(hd + 12))
                continue;
            if (++candidates > SCAN_CANDIDATES) {
                *found = 1; /* no crash writes this many record headers */
                break;
            }
            /* the payload's checksum, read apart (it may be long) */
            uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
            uint8_t chunk[65536];
            uint64_t done = 0;
            while (done < len) {
                size_t k = len - done < sizeof chunk ? (size_t)(len - done) : sizeof chunk;
                ssize_t r = read_at(j->fd, chunk, k, pos + REC_HEADER + done);
                if (r != (ssize_t)k) {
                    ret = ic_error_os(err, r < 0 ? errno : EIO, j->path,
                                      "cannot read the journal");
                    break;
                }
                c = crc_add(c, chunk, k);
                done += k;
            }
            if (ret == 0 && c == get32(hd + 8)) {
                *found = 1;
                break;
            }
            if (ret)
                break;
        }
        at += i; /* the window's last header-sized tail is read again */
        if (i == 0)
            break;
    }
    free(buf);
    return ret;
}

/* Check a whole record's payload and add its ranges, pieces and digests */
static int take_record(struct ic_journal *j, uint64_t pos, const uint8_t *p, uint64_t len,
                       struct journal_pieces *pc, struct ic_error *err)
{
    uint32_t n = get32(p), flags = get32(p + 4);
    if (flags != 0)
        return CORRUPT("record at %llu: unknown flags %#x", (unsigned long long)pos, flags);
    if (n == 0 || n > (len - PAYLOAD_MIN) / 16)
        return CORRUPT("record at %llu: %u ranges in %llu bytes", (unsigned long long)pos, n,
                       (unsigned long long)len);
    uint64_t rest = len - PAYLOAD_MIN - 16ull * n, blocks = 0;
    const uint8_t *rp = p + PAYLOAD_MIN;
    for (uint32_t i = 0; i < n; i++) {
        struct ic_range r = {get64(rp + 16 * i), get64(rp + 16 * i + 8)};
        if (!journal_range_ok(j, r))
            return CORRUPT("record at %llu: range %llu+%llu (size %llu, block size %llu)",
                           (unsigned long long)pos, (unsigned long long)r.offset,
                           (unsigned long long)r.length, (unsigned long long)j->size,
                           (unsigned long long)j->block_size);
        if (j->digest_size) {
            /* the blocks must fit the bitmap the record holds */
            uint64_t c = journal_blocks_of(j, r.length);
            if (rest > UINT64_MAX / 8 || c > rest * 8 - blocks)
                return CORRUPT("record at %llu: more blocks than its %llu bytes describe",
                               (unsigned long long)pos, (unsigned long long)len);
            blocks += c;
        }
    }
    const uint8_t *bits = rp + 16ull * n;
    uint64_t ndata = 0, bm = 0;
    if (j->digest_size) {
        bm = blocks / 8 + (blocks % 8 != 0);
        if (bm > rest)
            return CORRUPT("record at %llu: its zero-block bitmap is cut short",
                           (unsigned long long)pos);
        if (blocks % 8 && bits[bm - 1] >> (blocks % 8))
            return CORRUPT("record at %llu: bits set past its %llu blocks",
                           (unsigned long long)pos, (unsigned long long)blocks);
        uint64_t zeros = 0;
        for (uint64_t i = 0; i < bm; i++)
            zeros += (uint64_t)__builtin_popcount(bits[i]);
        ndata = blocks - zeros;
        if (ndata > (rest - bm) / j->digest_size || rest - bm != ndata * j->digest_size)
            return CORRUPT("record at %llu: %llu digest bytes for %llu data blocks",
                           (unsigned long long)pos, (unsigned long long)(rest - bm),
                           (unsigned long long)ndata);
    } else if (rest != 0) {
        return CORRUPT("record at %llu: %llu bytes after its ranges", (unsigned long long)pos,
                       (unsigned long long)rest);
    }

    /* the record holds: add it (its sizes are bounded by its own length,
     * so memory follows the file's size) */
    struct ic_range *ranges = malloc(n * sizeof *ranges);
    if (!ranges)
        return ic_error_nomem(err);
    for (uint32_t i = 0; i < n; i++)
        ranges[i] = (struct ic_range){get64(rp + 16 * i), get64(rp + 16 * i + 8)};
    int ret = journal_add_loaded(j, ranges, n, bits, bits + bm, ndata, pc, err);
    free(ranges);
    return ret;
}

int journal_load(struct ic_journal *j, const struct ic_journal_identity *id, uint64_t fsize,
                 struct ic_error *err)
{
    size_t n = fsize < IC_JOURNAL_HEADER_MAX ? (size_t)fsize : IC_JOURNAL_HEADER_MAX;
    uint8_t *head = malloc(n ? n : 1);
    if (!head)
        return ic_error_nomem(err);
    ssize_t got = read_at(j->fd, head, n, 0);
    if (got < 0) {
        free(head);
        return ic_error_os(err, errno, j->path, "cannot read the journal");
    }
    if ((size_t)got < n) /* it shrank since fstat (we hold the lock: not a copy of ours) */
        fsize = n = (size_t)got;
    size_t hours;
    uint8_t *ours = journal_build_header(id, &hours);
    if (!ours) {
        free(head);
        return ic_error_nomem(err);
    }
    int torn = fsize == n && torn_creation(head, n, ours, hours);
    free(ours);
    if (torn) {
        free(head);
        return 1; /* writing it anew is the file's life, not its format */
    }
    int ret = 0;
    uint32_t h = n >= 16 ? get32(head + 12) : 0;
    if (n < 16 || memcmp(head, MAGIC, 8) != 0)
        ret = ic_error_format(err, j->path, "not an imgcopy journal (no magic)");
    else if (get32(head + 8) != IC_JOURNAL_VERSION)
        ret = ic_error_format(err, j->path, "corrupt journal: unsupported version %u",
                              get32(head + 8));
    else if (h < FIXED + 4 || h > n)
        ret = CORRUPT("header: %u bytes long, the file %llu", h, (unsigned long long)fsize);
    else if (get32(head + h - 4) != crc(head, h - 4))
        ret = CORRUPT("header: its checksum fails");
    else
        ret = check_identity(j, head, h, id, err);
    free(head);
    if (ret)
        return ret;
    j->resumed = 1;
    if (fsize == h) {
        j->end = h;
        return 0;
    }

    struct journal_pieces pc = {0};
    uint8_t *payload = NULL;
    size_t payload_cap = 0;
    uint64_t pos = h;
    while (pos < fsize && ret == 0) {
        uint8_t hd[REC_HEADER];
        int whole = 0;
        uint64_t len = 0;
        if (fsize - pos >= REC_HEADER) {
            got = read_at(j->fd, hd, REC_HEADER, pos);
            if (got < 0) {
                ret = ic_error_os(err, errno, j->path, "cannot read the journal");
                break;
            }
            len = get64(hd);
            if (got == REC_HEADER && crc(hd, 12) == get32(hd + 12) && len >= PAYLOAD_MIN &&
                len <= fsize - pos - REC_HEADER) {
                if (len > SIZE_MAX) {
                    ret = ic_error_nomem(err);
                    break;
                }
                if (journal_reserve(&payload, &payload_cap, (size_t)len, 1) < 0) {
                    ret = ic_error_nomem(err);
                    break;
                }
                got = read_at(j->fd, payload, (size_t)len, pos + REC_HEADER);
                if (got < 0) {
                    ret = ic_error_os(err, errno, j->path, "cannot read the journal");
                    break;
                }
                whole = (uint64_t)got == len && crc(payload, (size_t)len) == get32(hd + 8);
            }
        }
        if (!whole) {
            int found;
            ret = whole_record_after(j, pos, fsize, &found, err);
            if (ret == 0 && found)
                ret = CORRUPT("record at %llu: damaged (its checksum fails), and records "
                              "follow it", (unsigned long long)pos);
            break; /* else the torn tail: dropped */
        }
        ret = take_record(j, pos, payload, len, &pc, err);
        pos += REC_HEADER + len;
    }
    free(payload);
    if (ret == 0) {
        j->end = pos;
        j->cut = pos < fsize;
        ret = journal_settle(j, &pc, err);
    }
    free(pc.p);
    return ret;
}

uint8_t *journal_encode_pending(const struct ic_journal *j, size_t *total)
{
    uint64_t bm = j->digest_size ? j->npbits / 8 + (j->npbits % 8 != 0) : 0;
    uint64_t len = PAYLOAD_MIN + 16ull * j->npend + bm + (uint64_t)j->pend_data * j->digest_size;
    if (len > SIZE_MAX - REC_HEADER)
        return NULL;
    uint8_t *b = calloc(1, (size_t)len + REC_HEADER);
    if (!b)
        return NULL;
    uint8_t *p = b + REC_HEADER;
    put32(p, (uint32_t)j->npend);
    put32(p + 4, 0);
    for (size_t i = 0; i < j->npend; i++) {
        put64(p + PAYLOAD_MIN + 16 * i, j->pend[i].offset);
        put64(p + PAYLOAD_MIN + 16 * i + 8, j->pend[i].length);
    }
    if (j->digest_size) {
        uint8_t *bits = p + PAYLOAD_MIN + 16 * j->npend;
        if (bm)
            memcpy(bits, j->pbits, bm);
        if (j->pend_data)
            memcpy(bits + bm, j->dig + (j->ndig - j->pend_data) * j->digest_size,
                   j->pend_data * j->digest_size);
    }
    put64(b, len);
    put32(b + 8, crc(p, (size_t)len));
    put32(b + 12, crc(b, 12));
    *total = (size_t)len + REC_HEADER;
    return b;
}
