/* Which zero runs inside data become holes, judged as qemu-img convert -S
 * judges them so that outputs allocate what qemu's do: qemu reads each
 * data extent in 2 MiB requests counted from the extent's start and, inside
 * a request, finds zeros on blocks of the largest power of two not above
 * the threshold, aligned in the guest and clipped at the request's edges.
 * A run of zero blocks becomes a hole when it is at least the threshold
 * long or touches a request's edge, and is written as data otherwise.
 * Here those requests are "windows", independent of the caller's buffers:
 * a run that reaches a buffer's edge inside a window is measured across it
 * by reading ahead or behind, so the verdict never depends on where the
 * caller cut its buffers. */
#include "sparse.h"

#include "imgcopy.h"

uint64_t ic_sparse_granularity(uint64_t threshold)
{
    if (threshold == 0)
        return 4096;
    uint64_t g = 512;
    while (g * 2 <= threshold)
        g *= 2;
    return g;
}

/* The window around `pos`: [*ws, *we). */
static void window_of(uint64_t ext_start, uint64_t ext_end, uint64_t pos, uint64_t *ws,
                      uint64_t *we)
{
    *ws = ext_start + (pos - ext_start) / IC_SPARSE_WINDOW * IC_SPARSE_WINDOW;
    *we = ext_end - *ws > IC_SPARSE_WINDOW ? *ws + IC_SPARSE_WINDOW : ext_end;
}

/* The end of the block at `pos`: aligned in the guest, clipped at the
 * window and at `limit`. */
static uint64_t block_end(const struct ic_sparse *sp, uint64_t ext_start, uint64_t ext_end,
                          uint64_t pos, uint64_t limit)
{
    uint64_t ws, we;
    window_of(ext_start, ext_end, pos, &ws, &we);
    uint64_t next = (pos / sp->granularity + 1) * sp->granularity;
    if (next > we)
        next = we;
    return next < limit ? next : limit;
}

/* Zero bytes that continue a run from `from` (a block boundary) forward
 * or backward, counted in whole blocks, up to `need` bytes, inside the
 * window [ws, we); *edge is set when the zeros reach its edge. */
static int measure_zeros(const struct ic_sparse *sp, uint64_t ws, uint64_t we, uint64_t from,
                         uint64_t need, int forward, uint64_t *found, int *edge)
{
    uint64_t g = sp->granularity, pos = from;
    *found = 0;
    *edge = 0;
    while (*found < need) {
        uint64_t chunk = (need - *found + g - 1) / g * g;
        if (chunk > sp->scratch_size)
            chunk = sp->scratch_size;
        uint64_t lo, hi;
        if (forward) {
            lo = pos;
            hi = we - pos < chunk ? we : pos + chunk;
        } else {
            hi = pos;
            lo = pos - ws < chunk ? ws : pos - chunk;
        }
        if (lo == hi) {
            *edge = 1;
            return 0;
        }
        if (sp->read(sp->ctx, sp->scratch, lo, hi - lo) < 0)
            return -1;
        for (uint64_t k = 0; k < hi - lo; k += g) {
            /* blocks walk away from `from`; only the last may be partial */
            uint64_t n = hi - lo - k < g ? hi - lo - k : g;
            uint64_t b0 = forward ? lo + k : hi - k - n;
            if (!ic_is_zero(sp->scratch + (b0 - lo), (size_t)n))
                return 0;
            *found += n;
            if (*found >= need)
                return 0;
        }
        pos = forward ? hi : lo;
        if (pos == (forward ? we : ws)) {
            *edge = 1;
            return 0;
        }
    }
    return 0;
}

/* Does the zero run [za, zb) of the buffer [start, end) become a hole? */
static int is_hole(const struct ic_sparse *sp, uint64_t start, uint64_t end, uint64_t ext_start,
                   uint64_t ext_end, uint64_t za, uint64_t zb, int *verdict)
{
    uint64_t len = zb - za, found, ws, we;
    int edge;
    *verdict = 1;
    window_of(ext_start, ext_end, za, &ws, &we);
    /* touching or spanning a window's edge, or long enough */
    if (za == ws || zb >= we || len >= sp->threshold)
        return 0;
    if (za == start) {
        if (measure_zeros(sp, ws, we, za, sp->threshold - len, 0, &found, &edge) < 0)
            return -1;
        len += found;
        if (edge || len >= sp->threshold)
            return 0;
    }
    if (zb == end) {
        if (measure_zeros(sp, ws, we, zb, sp->threshold - len, 1, &found, &edge) < 0)
            return -1;
        len += found;
        if (edge || len >= sp->threshold)
            return 0;
    }
    *verdict = 0;
    return 0;
}

int ic_sparse_split(const struct ic_sparse *sp, const uint8_t *buf, uint64_t start, uint64_t end,
                    uint64_t ext_start, uint64_t ext_end,
                    void (*emit)(void *emit_ctx, uint64_t off, uint64_t len, int data),
                    void *emit_ctx)
{
    uint64_t pending = start; /* start of data not yet emitted */
    uint64_t pos = start;
    while (pos < end) {
        uint64_t b1 = block_end(sp, ext_start, ext_end, pos, end);
        if (!ic_is_zero(buf + (pos - start), (size_t)(b1 - pos))) {
            pos = b1;
            continue;
        }
        uint64_t za = pos;
        pos = b1;
        while (pos < end) {
            b1 = block_end(sp, ext_start, ext_end, pos, end);
            if (!ic_is_zero(buf + (pos - start), (size_t)(b1 - pos)))
                break;
            pos = b1;
        }
        int hole;
        if (is_hole(sp, start, end, ext_start, ext_end, za, pos, &hole) < 0)
            return -1;
        if (!hole)
            continue;
        if (za > pending)
            emit(emit_ctx, pending, za - pending, 1);
        emit(emit_ctx, za, pos - za, 0);
        pending = pos;
    }
    if (end > pending)
        emit(emit_ctx, pending, end - pending, 1);
    return 0;
}
