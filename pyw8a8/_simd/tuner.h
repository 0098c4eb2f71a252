/* The blocking of a product, tuned on real calls (call_path.h runs them).  Results never
 * depend on it (every sum is exact, converted once); what is tuned is the K-range width kc
 * (the B micro-panels filling L1, or the whole K), the M block mc, the task split and, for
 * one or two row tiles, whether the kernels prefetch the weight.  A new shape's first calls
 * try each candidate in turn (round-robin, as gemma.cpp's autotuner does), then the
 * fastest is kept: the shape is *settled*, and each weight of the call remembers that
 * blocking (plan.h).  An entry's key holds the kernel (ISA and weight encoding), the
 * weights in the call, an M bucket, K, N and the thread count.  Everything here runs
 * under call_path.h's lock. */
#ifndef PYW8A8_SIMD_TUNER_H
#define PYW8A8_SIMD_TUNER_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu.h"

typedef struct {
    int64_t kc, mc, nc, m_step, n_step;
    int64_t prefetch; /* 1: the ISA's prefetching kernels (gemm_loops.h's w8_kernel_of) */
} w8_blocking;

/* An ISA as tuning tells them apart: the registry's name, its kernel (a copy whose
 * kernels do no arithmetic, bench --overhead's, is another) and its register tile. */
typedef struct {
    const char *name;
    const void *kernel;
    int mr, npanels;
} w8_isa_id;

static inline w8_isa_id w8_isa_id_of(const w8_isa_ops *ops)
{
    w8_isa_id id = {ops->name, (const void *)ops->ukernel[0], ops->mr, ops->npanels};
    return id;
}

static inline int w8_same_isa(w8_isa_id a, w8_isa_id b)
{
    return a.name == b.name && a.kernel == b.kernel && a.mr == b.mr && a.npanels == b.npanels;
}

#define W8_TUNE_ROUNDS 3
#define W8_TUNE_SLOWER 1.25 /* candidates this much slower than the best are dropped */
#define W8_MAX_CANDIDATES 32

static inline int64_t w8_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static inline int64_t w8_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t w8_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t w8_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The per-core caches the blocks are sized for, as the CPU reports them (cpu.h); where it
 * cannot tell, the smallest of the x86 CPUs measured (Zen 3: 32 KiB and 512 KiB). */
static inline int64_t w8_tuned_cache_bytes(int level)
{
    const int64_t bytes = w8_cache_bytes(level);
    return bytes > 0 ? bytes : (level == 1 ? 32 * 1024 : 512 * 1024);
}

/* K-range width: the B micro-panels of a tile (kc x 16 npanels bytes each, `streams` of
 * them: two for a gated pair) fit in L1; or the whole K for an ISA whose C tiles
 * accumulate over all of it (AMX), and for a call of at most two row tiles (`m` rows; -1:
 * any), where a panel is read once, or twice with the second from L2, so a K-range buys
 * no reuse and costs a second pass over the output (M = 1 and 8 ran 1.5-2.6% faster over
 * the whole K, AVX-512 on the Xeon). */
static inline int64_t w8_kc_for(const w8_isa_ops *ops, int64_t kp, int streams, int64_t m)
{
    if (ops->whole_k || (m >= 0 && m <= 2 * ops->mr)) return kp;
    const int64_t ncols = W8_NR * ops->npanels;
    const int64_t kc = (w8_tuned_cache_bytes(1) / (ncols * streams)) / W8_KPAD * W8_KPAD;
    return w8_min64(w8_max64(W8_KPAD, kc), kp);
}

/* Shapes whose M falls in one bucket share a tuning entry. */
static inline int64_t w8_m_bucket(int64_t m)
{
    if (m <= 16) return m;
    int64_t b = 1;
    while (b < m) b <<= 1;
    return b;
}

/* (m_step, n_step) task splits, the heuristic default first: over N (each task all the
 * rows of a column block; over M too where N has too few blocks, from two row tiles a
 * thread), and from one row tile a thread over M only (each task all the columns of its
 * rows, which it quantizes itself: product.h's w8_tasks_own_rows), the default where the
 * whole weight fits in L2: at 64 x 2048 x 640 on AMX (one 32-row tile each), a thread
 * that quantizes its rows and reads the whole weight from its own L2 ran 1.2x as fast as
 * the split over N (2 Xeon vCPUs).  Returns the count written to splits (at most 5). */
static int w8_task_splits(const w8_isa_ops *ops, int64_t m, int64_t n, int64_t kp,
                          int nthreads, int streams, int64_t splits[][2])
{
    const int64_t ncols = W8_NR * ops->npanels, mr = ops->mr;
    const int64_t groups = w8_round_up(n, ncols) / ncols;
    const int rows_for_threads = nthreads > 1 && m >= 2 * mr * nthreads;
    static const int over_n_tasks[3] = {2, 1, 4}, over_m_tasks[2] = {1, 2};
    int64_t over_n[3][2], over_m[2][2];
    int nn = 0, nm = 0;
    for (int i = 0; i < 3; i++) {
        const int64_t want = (int64_t)over_n_tasks[i] * nthreads;
        const int64_t n_tasks = w8_max64(1, w8_min64(groups, want));
        int64_t m_tasks = 1;
        if (rows_for_threads && n_tasks < want) m_tasks = w8_ceil_div(want, n_tasks);
        over_n[nn][0] = m ? w8_round_up(w8_ceil_div(m, m_tasks), mr) : mr;
        over_n[nn++][1] = w8_round_up(groups, n_tasks) / n_tasks * ncols;
    }
    if (nthreads > 1 && m >= mr * nthreads) {
        for (int i = 0; i < 2; i++) {
            const int64_t m_step = w8_round_up(w8_ceil_div(m, (int64_t)over_m_tasks[i] * nthreads),
                                               mr);
            if (w8_ceil_div(m, m_step) >= nthreads) { /* tasks own their rows only so */
                over_m[nm][0] = m_step;
                over_m[nm++][1] = w8_round_up(n, ncols);
            }
        }
    }
    const int fits_l2 = w8_round_up(n, ncols) * kp * streams <= w8_tuned_cache_bytes(2);
    int count = 0;
    for (int pass = 0; pass < 2; pass++) {
        const int take_m = (pass == 0) == fits_l2;
        const int64_t(*from)[2] = take_m ? (const int64_t(*)[2])over_m : (const int64_t(*)[2])over_n;
        for (int i = 0; i < (take_m ? nm : nn); i++) {
            splits[count][0] = from[i][0];
            splits[count++][1] = from[i][1];
        }
    }
    return count;
}

/* The candidate blockings of a shape, the heuristic default first; returns their count.
 * Besides the K-ranges whose B micro-panels fill L1, each task split is tried once over
 * the whole K where its panels fit in half of L2: a K-range costs a pass over the
 * output's int32 sums (the whole K took down to 0.79x the time of kc = 1024 at K = 1152
 * to 2048; Zen 3, avx2, 2 threads).  `m` is the bucket's first call's (exact up to 16
 * rows, so calls of one or two row tiles all take the whole K, as w8_kc_for says). */
static int w8_candidates(const w8_isa_ops *ops, int64_t m, int64_t n, int64_t kp,
                         int nthreads, int streams, w8_blocking *out)
{
    const int64_t kc = w8_kc_for(ops, kp, streams, m), mr = ops->mr;
    const int64_t ncols = W8_NR * ops->npanels, half_l2 = w8_tuned_cache_bytes(2) / 2;
    const int64_t nc_l2 = w8_max64(ncols, (half_l2 / w8_max64(kc * streams, 1)) / ncols * ncols);
    const int whole_k = kc < kp && kp * ncols * streams <= half_l2;
    /* An ISA whose C tiles accumulate over the whole K (AMX) reads a row block's A from L2
     * again for every pair of panels, and the panels from L2 for every row block: 26-34%
     * of the tile unit's peak from 256 rows (2 Xeon vCPUs, issue 60).  Also timed: K-ranges
     * over which an A block of two row tiles and the B micro-panels fit in half of L1, so
     * each is read from L2 once a block (bench --amx-model: 59-62% of the peak there). */
    const int64_t kc_l1 = w8_max64(W8_KPAD, w8_tuned_cache_bytes(1) / 2 /
                                   (2 * mr + ncols * streams) / W8_KPAD * W8_KPAD);
    const int a_in_l1 = ops->whole_k && kc_l1 < kp;
    int64_t splits[5][2];
    const int nsplits = w8_task_splits(ops, m, n, kp, nthreads, streams, splits);
    int count = 0;
    for (int s = 0; s < nsplits; s++) {
        const int64_t m_step = splits[s][0], n_step = splits[s][1];
        const int64_t fit = w8_max64(mr, (half_l2 / w8_max64(kc, 1)) / mr * mr);
        const int64_t mcs[2] = {fit, w8_max64(mr, fit / 4 / mr * mr)};
        const int64_t ncs[2] = {n_step, w8_min64(n_step, nc_l2)};
        w8_blocking blocks[6];
        int nblocks = 0;
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                w8_blocking b = {kc, mcs[i], ncs[j], m_step, n_step, 0};
                blocks[nblocks++] = b;
            }
        if (whole_k) {
            w8_blocking b = {kp, w8_max64(mr, (half_l2 / kp) / mr * mr), n_step, m_step,
                             n_step, 0};
            blocks[nblocks++] = b;
        }
        if (a_in_l1) {
            w8_blocking b = {kc_l1, 2 * mr, n_step, m_step, n_step, 0};
            blocks[nblocks++] = b;
        }
        for (int i = 0; i < nblocks; i++) {
            w8_blocking c = blocks[i];
            c.mc = w8_min64(c.mc, w8_max64(m_step, mr));
            int seen = 0;
            for (int j = 0; j < count && !seen; j++) seen = !memcmp(&out[j], &c, sizeof c);
            if (!seen && count < W8_MAX_CANDIDATES) out[count++] = c;
        }
    }
    /* One or two row tiles stream the weight with too little arithmetic to hide its
     * latency: each candidate is also timed with the kernels that prefetch it (ukernel.h,
     * amx.h), which help a weight beyond L2 and slow one within it. */
    if (m >= 0 && m <= 2 * mr && ops->ukernel_prefetch[0]) {
        const int plain = count;
        for (int i = 0; i < plain && count < W8_MAX_CANDIDATES; i++) {
            out[count] = out[i];
            out[count++].prefetch = 1;
        }
    }
    return count;
}

/* A bucket's candidate adapted to a call's exact M. */
static inline w8_blocking w8_fit_blocking(w8_blocking b, int64_t m)
{
    b.mc = w8_max64(1, w8_min64(b.mc, m));
    b.m_step = w8_max64(1, w8_min64(b.m_step, m));
    return b;
}

typedef struct {
    w8_isa_id isa;
    int enc, group, streams, nthreads;
    int64_t bucket, kp, n;
} w8_tune_key;

typedef struct {
    w8_tune_key key;
    w8_blocking cands[W8_MAX_CANDIDATES];
    double times[W8_MAX_CANDIDATES];
    int alive[W8_MAX_CANDIDATES];
    int ncands, nalive;
    /* Calls so far, and the call count at which the current round (a call per live
     * candidate) ends: counted, not found as a multiple, since the two weights of a pair
     * of one shape share an entry and step it by two. */
    int64_t calls, round_end;
    int best; /* the settled candidate, or -1 */
} w8_tune_entry;

typedef struct {
    w8_tune_entry **entries;
    int64_t count, capacity;
} w8_tuner;

/* What a call runs with: the blocking, and the candidate to report its time to (`index`:
 * W8_TUNE_SETTLED once the shape is settled, W8_TUNE_UNTIMED for its first call). */
#define W8_TUNE_SETTLED (-2)
#define W8_TUNE_UNTIMED (-1)
typedef struct {
    w8_tune_entry *entry;
    int index;
    w8_blocking blocking;
} w8_tune_choice;

static int w8_same_key(const w8_tune_key *a, const w8_tune_key *b)
{
    return w8_same_isa(a->isa, b->isa) && a->enc == b->enc && a->group == b->group &&
           a->streams == b->streams && a->nthreads == b->nthreads &&
           a->bucket == b->bucket && a->kp == b->kp && a->n == b->n;
}

/* The entry of `key`, made with its candidates where new (NULL: no memory). */
static w8_tune_entry *w8_tune_entry_of(w8_tuner *t, const w8_tune_key *key,
                                       const w8_isa_ops *ops, int64_t m, int *made)
{
    *made = 0;
    for (int64_t i = 0; i < t->count; i++)
        if (w8_same_key(&t->entries[i]->key, key)) return t->entries[i];
    if (t->count == t->capacity) {
        const int64_t capacity = t->capacity ? 2 * t->capacity : 64;
        w8_tune_entry **grown = (w8_tune_entry **)realloc(t->entries,
                                                          capacity * sizeof *grown);
        if (grown == NULL) return NULL;
        t->entries = grown;
        t->capacity = capacity;
    }
    w8_tune_entry *e = (w8_tune_entry *)calloc(1, sizeof *e);
    if (e == NULL) return NULL;
    e->key = *key;
    e->ncands = w8_candidates(ops, m, key->n, key->kp, key->nthreads, key->streams, e->cands);
    for (int i = 0; i < e->ncands; i++) {
        e->times[i] = INFINITY;
        e->alive[i] = i;
    }
    e->nalive = e->ncands;
    e->round_end = e->ncands;
    e->best = e->ncands == 1 ? 0 : -1;
    t->entries[t->count++] = e;
    *made = 1;
    return e;
}

/* The blocking of the next call of a shape of `m` rows, with weight encoding `enc`, in a
 * call of `group` weights whose tiles each read `streams` weights.  A shape's first call
 * carries one-time costs (the scratch growing, its pages faulting in): it runs the
 * default untimed, so that no candidate, the default least of all, is judged on it. */
static int w8_tune_choose(w8_tuner *t, const w8_isa_ops *ops, int enc, int group, int64_t m,
                          int64_t n, int64_t kp, int nthreads, int streams,
                          w8_tune_choice *choice)
{
    w8_tune_key key;
    memset(&key, 0, sizeof key);
    key.isa = w8_isa_id_of(ops);
    key.enc = enc, key.group = group, key.streams = streams, key.nthreads = nthreads;
    key.bucket = w8_m_bucket(m), key.kp = kp, key.n = n;
    int made;
    w8_tune_entry *e = w8_tune_entry_of(t, &key, ops, m, &made);
    if (e == NULL) return -1;
    choice->entry = e;
    if (made) {
        choice->index = W8_TUNE_UNTIMED;
        choice->blocking = w8_fit_blocking(e->cands[0], m);
    } else if (e->best >= 0) {
        choice->index = W8_TUNE_SETTLED;
        choice->blocking = w8_fit_blocking(e->cands[e->best], m);
    } else {
        choice->index = e->alive[e->calls % e->nalive];
        e->calls++;
        choice->blocking = w8_fit_blocking(e->cands[choice->index], m);
    }
    return 0;
}

/* A timed call of candidate `index`.  Candidates are dropped after each round but the
 * first, whose calls still carry warm-up costs (the thread team and the caches settling:
 * the first timed calls of a shape took up to 2x the steady time). */
static void w8_tune_record(w8_tune_entry *e, int index, double seconds)
{
    if (index < 0 || e->best >= 0) return;
    if (seconds < e->times[index]) e->times[index] = seconds;
    if (e->calls < e->round_end) return;
    if (e->round_end > e->ncands) {
        double best = INFINITY;
        for (int i = 0; i < e->nalive; i++)
            if (e->times[e->alive[i]] < best) best = e->times[e->alive[i]];
        int kept = 0;
        for (int i = 0; i < e->nalive; i++)
            if (e->times[e->alive[i]] <= best * W8_TUNE_SLOWER) e->alive[kept++] = e->alive[i];
        e->nalive = kept;
        if (e->calls >= (int64_t)W8_TUNE_ROUNDS * e->ncands || e->nalive == 1) {
            int fastest = e->alive[0];
            for (int i = 1; i < e->nalive; i++)
                if (e->times[e->alive[i]] < e->times[fastest]) fastest = e->alive[i];
            e->best = fastest;
        }
    }
    e->round_end = e->calls + e->nalive;
}

/* How many shapes are still being tuned. */
static int64_t w8_tune_unsettled(const w8_tuner *t)
{
    int64_t n = 0;
    for (int64_t i = 0; i < t->count; i++) n += t->entries[i]->best < 0;
    return n;
}

static void w8_tune_clear(w8_tuner *t)
{
    for (int64_t i = 0; i < t->count; i++) free(t->entries[i]);
    t->count = 0;
}

#endif
