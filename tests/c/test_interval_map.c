/* Randomised test of the interval map against a per-unit model. */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "imgcopy.h"
#include "interval_map.h"

#define UNITS 300

struct unit {
    int known;
    uint32_t flags;
    uint32_t depth;
    uint64_t host;
};

static struct unit model[UNITS];


static void verify(const struct ic_interval_map *m, unsigned step)
{
    for (size_t i = 0; i < m->n; i++) {
        CHECK(m->v[i].start < m->v[i].end, "step %u: empty interval %zu", step, i);
        if (i > 0) {
            CHECK(m->v[i - 1].end <= m->v[i].start, "step %u: overlap at %zu", step, i);
            CHECK(!ic_interval_mergeable(&m->v[i - 1], &m->v[i]),
                  "step %u: unmerged neighbours at %zu", step, i);
        }
    }
    for (uint64_t u = 0; u < UNITS; u++) {
        const struct ic_interval *iv = ic_imap_find(m, u);
        CHECK(!!iv == model[u].known, "step %u: unit %llu known %d", step,
              (unsigned long long)u, model[u].known);
        if (iv) {
            CHECK(iv->flags == model[u].flags && iv->depth == model[u].depth,
                  "step %u: unit %llu value", step, (unsigned long long)u);
            if (iv->flags & IC_EXT_OFFSET_VALID)
                CHECK(iv->host + (u - iv->start) == model[u].host, "step %u: unit %llu host",
                      step, (unsigned long long)u);
        } else {
            uint64_t gs, ge;
            ic_imap_gap(m, u, UNITS, &gs, &ge);
            CHECK(gs <= u && u < ge, "step %u: gap around %llu", step, (unsigned long long)u);
            CHECK(gs == 0 || model[gs - 1].known, "step %u: gap start", step);
            CHECK(ge == UNITS || model[ge].known, "step %u: gap end", step);
            for (uint64_t k = gs; k < ge; k++)
                CHECK(!model[k].known, "step %u: gap holds known unit %llu", step,
                      (unsigned long long)k);
        }
    }
}

static struct ic_interval random_interval(void)
{
    uint64_t a = (uint64_t)(rand() % UNITS);
    uint64_t len = 1 + (uint64_t)(rand() % (rand() % 4 == 0 ? UNITS : 12));
    uint64_t b = a + len > UNITS ? UNITS : a + len;
    static const uint32_t kinds[] = {
        IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID,
        IC_EXT_ZERO | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID,
        IC_EXT_ZERO,
    };
    struct ic_interval iv = {
        .start = a,
        .end = b,
        .flags = kinds[rand() % 3],
        .depth = (uint32_t)(rand() % 2),
        /* mostly identity mapped, so that merges happen */
        .host = rand() % 4 ? a : a + 1000,
    };
    return iv;
}

int main(void)
{
    srand(12345);
    for (int round = 0; round < 40; round++) {
        struct ic_interval_map m;
        ic_imap_init(&m);
        for (uint64_t u = 0; u < UNITS; u++)
            model[u].known = 0;
        for (unsigned step = 0; step < 400; step++) {
            struct ic_interval iv = random_interval();
            int op = rand() % 4;
            int r;
            struct ic_interval run[3];
            size_t nrun = 0;
            if (op == 3) {
                /* a run of contiguous pieces, like a driver's walk */
                for (uint64_t a = iv.start; a < iv.end && nrun < 3; nrun++) {
                    uint64_t b = nrun == 2 ? iv.end : a + 1 + (uint64_t)rand() % (iv.end - a);
                    run[nrun] = random_interval();
                    run[nrun].start = a;
                    run[nrun].end = b;
                    run[nrun].host = rand() % 2 ? a : a + 7;
                    a = b;
                }
                iv.end = run[nrun - 1].end;
                r = ic_imap_assign_run(&m, run, nrun);
            } else if (op == 0)
                r = ic_imap_assign(&m, &iv);
            else if (op == 1)
                r = ic_imap_update_known(&m, &iv);
            else
                r = ic_imap_forget(&m, iv.start, iv.end);
            CHECK(r == 0, "op failed");
            for (size_t k = 0; k < nrun; k++)
                for (uint64_t u = run[k].start; u < run[k].end; u++) {
                    model[u].known = 1;
                    model[u].flags = run[k].flags;
                    model[u].depth = run[k].depth;
                    model[u].host = run[k].host + (u - run[k].start);
                }
            for (uint64_t u = iv.start; op != 3 && u < iv.end; u++) {
                if (op == 2) {
                    model[u].known = 0;
                } else if (op == 0 || model[u].known) {
                    model[u].known = 1;
                    model[u].flags = iv.flags;
                    model[u].depth = iv.depth;
                    model[u].host = iv.host + (u - iv.start);
                }
            }
            verify(&m, step);
        }
        ic_imap_free(&m);
    }
    /* a forward walk of many extents appends without quadratic moves */
    struct ic_interval_map m;
    ic_imap_init(&m);
    for (uint64_t i = 0; i < 200000; i++) {
        struct ic_interval iv = {.start = i * 2, .end = i * 2 + 2, .host = i * 2,
                                 .flags = (i & 1) ? IC_EXT_DATA : IC_EXT_ZERO};
        CHECK(ic_imap_assign(&m, &iv) == 0, "assign");
    }
    CHECK(m.n == 200000, "count %zu", m.n);
    ic_imap_free(&m);
    printf("test_interval_map: %lu checks passed\n", check_count);
    return 0;
}
