/* Block status is asked of a driver once per extent: answers are kept as
 * intervals, and a miss asks the driver to walk forward from the start of
 * the unknown gap (a known extent boundary, or 0), so every system call the
 * driver makes discovers a boundary nobody knew; that keeps the cost of
 * mapping an image O(extents) whatever order the queries come in.  (Drivers
 * that answer from tables in memory start at the query instead.) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"

static struct ic_interval to_interval(const struct ic_extent *e)
{
    struct ic_interval iv = {
        .start = e->start,
        .end = e->start + e->length,
        .host = e->host_offset,
        .flags = e->flags,
        .depth = e->depth,
    };
    return iv;
}

int ic_cache_init(struct ic_image *img)
{
    ic_imap_init(&img->cache);
    memset(&img->walk, 0, sizeof img->walk);
    atomic_init(&img->cache_hits, 0);
    atomic_init(&img->cache_misses, 0);
    atomic_init(&img->lseek_calls, 0);
    return -pthread_mutex_init(&img->cache_lock, NULL);
}

void ic_cache_destroy(struct ic_image *img)
{
    ic_imap_free(&img->cache);
    ic_extent_list_free(&img->walk);
    pthread_mutex_destroy(&img->cache_lock);
}

static void answer(const struct ic_interval *iv, uint64_t off, uint64_t len, struct ic_extent *out)
{
    uint64_t end = iv->end < off + len ? iv->end : off + len;
    out->start = off;
    out->length = end - off;
    out->flags = iv->flags;
    out->depth = iv->depth;
    out->host_offset = (iv->flags & IC_EXT_OFFSET_VALID) ? iv->host + (off - iv->start) : 0;
}

/* Ask the driver about the gap holding `off` and record what it says (and
 * what `below` says where a format's layer holds nothing). */
static int learn(struct ic_image *img, uint64_t off, ic_status_below_fn *below_fn,
                 struct ic_error *err)
{
    uint64_t gap_start, gap_end;
    ic_imap_gap(&img->cache, off, img->size, &gap_start, &gap_end);
    /* formats that look up any offset directly (qcow2's tables) start at
     * the query: walking from the gap start would cost them the whole gap */
    if (img->drv->random_access_status)
        gap_start = off;
    img->walk.count = 0;
    if (img->drv->block_status(img, gap_start, gap_end, off, &img->walk, err) < 0)
        return -1;

    uint64_t expect = gap_start;
    struct ic_extent_list below = {0};
    int has_below = 0;
    for (size_t i = 0; i < img->walk.count; i++) {
        const struct ic_extent *e = &img->walk.items[i];
        if (e->start != expect || e->length == 0 || e->start + e->length > gap_end)
            return ic_error_os(err, EIO, img->path,
                               "driver %s answered block status out of order at %llu",
                               img->drv->name, (unsigned long long)e->start);
        expect = e->start + e->length;
        has_below |= (e->flags & IC_EXT_BELOW) != 0;
    }
    const struct ic_extent_list *answer = &img->walk;
    if (has_below) {
        for (size_t i = 0; i < img->walk.count; i++) {
            const struct ic_extent *e = &img->walk.items[i];
            if ((e->flags & IC_EXT_BELOW
                     ? below_fn(img, e->start, e->start + e->length, &below, err)
                     : ic_extent_list_add(&below, e, err)) < 0) {
                ic_extent_list_free(&below);
                return -1;
            }
        }
        answer = &below;
    }
    size_t n = answer->count;
    struct ic_interval *ivs = malloc((n ? n : 1) * sizeof *ivs);
    int r = ivs ? 0 : -1;
    for (size_t i = 0; ivs && i < n; i++)
        ivs[i] = to_interval(&answer->items[i]);
    if (ivs)
        r = ic_imap_assign_run(&img->cache, ivs, n);
    free(ivs);
    ic_extent_list_free(&below);
    if (r < 0)
        return ic_error_nomem(err);
    if (expect <= off)
        return ic_error_os(err, EIO, img->path, "driver %s did not answer block status at %llu",
                           img->drv->name, (unsigned long long)off);
    return 0;
}

int ic_cache_block_status(struct ic_image *img, uint64_t off, uint64_t len,
                          ic_status_below_fn *below, struct ic_extent *out,
                          struct ic_error *err)
{
    int ret = 0;
    pthread_mutex_lock(&img->cache_lock);
    const struct ic_interval *iv = ic_imap_find(&img->cache, off);
    if (iv) {
        atomic_fetch_add(&img->cache_hits, 1);
    } else {
        atomic_fetch_add(&img->cache_misses, 1);
        ret = learn(img, off, below, err);
        if (ret == 0)
            iv = ic_imap_find(&img->cache, off);
    }
    if (ret == 0)
        answer(iv, off, len, out);
    pthread_mutex_unlock(&img->cache_lock);
    return ret;
}

/* When the map cannot grow, knowing nothing is still the truth. */
static void note(struct ic_image *img, const struct ic_extent *e, int only_known)
{
    struct ic_interval iv = to_interval(e);
    pthread_mutex_lock(&img->cache_lock);
    int ret = only_known ? ic_imap_update_known(&img->cache, &iv)
                         : ic_imap_assign(&img->cache, &iv);
    if (ret < 0)
        ic_imap_clear(&img->cache);
    pthread_mutex_unlock(&img->cache_lock);
}

void ic_cache_note(struct ic_image *img, const struct ic_extent *e)
{
    note(img, e, 0);
}

void ic_cache_note_if_known(struct ic_image *img, const struct ic_extent *e)
{
    note(img, e, 1);
}

void ic_cache_forget(struct ic_image *img, uint64_t start, uint64_t end)
{
    pthread_mutex_lock(&img->cache_lock);
    if (ic_imap_forget(&img->cache, start, end) < 0)
        ic_imap_clear(&img->cache);
    pthread_mutex_unlock(&img->cache_lock);
}

void ic_image_cache_stats(struct ic_image *img, struct ic_cache_stats *out)
{
    out->hits = atomic_load(&img->cache_hits);
    out->misses = atomic_load(&img->cache_misses);
    out->lseek_calls = atomic_load(&img->lseek_calls);
    pthread_mutex_lock(&img->cache_lock);
    out->intervals = img->cache.n;
    pthread_mutex_unlock(&img->cache_lock);
}

void ic_image_drop_cache(struct ic_image *img)
{
    pthread_mutex_lock(&img->cache_lock);
    ic_imap_clear(&img->cache);
    pthread_mutex_unlock(&img->cache_lock);
}
