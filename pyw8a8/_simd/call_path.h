/* The call object of every product (call.h's interface): a weight's plan, the checks of a
 * call returning one fault, the blocking and its tuning memory, the thread's scratch, and
 * the run (product.h).  Compiled once, into pyw8a8._kernels, which hands it to numpy's
 * API directly and to the torch operator as the table of call.h.
 *
 *   w8_call_run: checks -> blocking (the plan's settled one, or the tuner's) -> scratch
 *                -> w8_product laid out -> w8_run_product -> the tuner told the time
 *
 * A settled shape's blocking is remembered on each weight's plan (plan.h).  One lock
 * guards the plans' slots and the tuner, held for lookups and updates only; a fork takes
 * it, so a child never inherits it held. */
#ifndef PYW8A8_SIMD_CALL_PATH_H
#define PYW8A8_SIMD_CALL_PATH_H

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call.h"
#include "common.h"
#include "faults.h"
#include "plan.h"
#include "product.h"
#include "tuner.h"

static pthread_mutex_t w8_call_lock = PTHREAD_MUTEX_INITIALIZER;
static w8_tuner w8_call_tuner;
static uint64_t w8_tuner_generation; /* a call's timing is for the tuner it chose from */
static pthread_key_t w8_scratch_key;

static void w8_call_lock_take(void) { pthread_mutex_lock(&w8_call_lock); }
static void w8_call_lock_give(void) { pthread_mutex_unlock(&w8_call_lock); }

typedef struct {
    void *data;
    size_t size;
} w8_scratch;

static void w8_scratch_free(void *s)
{
    free(((w8_scratch *)s)->data);
    free(s);
}

/* Once per process, at import: the scratch's thread key, and the lock taken around a
 * fork. */
static int w8_call_path_init(void)
{
    if (pthread_key_create(&w8_scratch_key, w8_scratch_free) != 0) return -1;
    return pthread_atfork(w8_call_lock_take, w8_call_lock_give, w8_call_lock_give);
}

/* The calling thread's scratch, grown to n bytes where smaller (64-byte aligned; freed
 * with the thread): reusing it spares a large product the allocation and page faults of
 * fresh memory.  NULL where no memory could be had. */
static void *w8_thread_scratch(size_t n)
{
    w8_scratch *s = (w8_scratch *)pthread_getspecific(w8_scratch_key);
    if (s == NULL) {
        if ((s = (w8_scratch *)calloc(1, sizeof *s)) == NULL) return NULL;
        if (pthread_setspecific(w8_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->size) {
        void *p = NULL;
        if (posix_memalign(&p, 64, n) != 0) return NULL;
        free(s->data);
        s->data = p;
        s->size = n;
    }
    return s->data;
}

/* ---- a call's product laid out in the scratch (product.h's w8_product) ---- */

typedef struct {
    const w8_plan *w;
    w8_blocking b;
    const float *bias;
    void *out;      /* NULL: none (the up projection of a gated pair) */
    int64_t ldo;
    int out_size;   /* bytes per output element */
} w8_call_weight;

static inline size_t w8_aligned(size_t n) { return (n + 63) / 64 * 64; }

/* The activation formats the weights read, one per sign flip and need of row sums,
 * prepared once each however many weights read them; weight j's to fmt_of[j]. */
static void w8_assign_formats(w8_product *p, const w8_call_weight *w, int nw, int *fmt_of)
{
    p->nformats = 0;
    for (int j = 0; j < nw; j++) {
        const uint8_t flip = p->ops->a_flip[w[j].w->enc];
        const int row_sums = W8_CORR_READS_ROWS(p->ops->corr[w[j].w->enc]);
        fmt_of[j] = -1;
        for (int f = 0; f < p->nformats; f++)
            if (p->fmt[f].flip == flip && p->fmt[f].row_sums == row_sums) fmt_of[j] = f;
        if (fmt_of[j] < 0) {
            fmt_of[j] = p->nformats;
            p->fmt[p->nformats].flip = flip;
            p->fmt[p->nformats++].row_sums = row_sums;
        }
    }
}

/* The scratch of p: each format's bytes and sums, the scales, the row statuses, the raw
 * sums that go to no output (sums[j]: a float product beyond W8_EXACT_K, int64, converted
 * at the end; the up projection of a gated pair; else NULL), one rotation row per thread.
 * Points p's buffers into it at `base` (unless NULL); returns its bytes. */
static size_t w8_lay_out_scratch(w8_product *p, const w8_call_weight *w, int nw, int glu,
                                 int wide, int nworkers, char *base, char **sums)
{
    const int64_t mp = (p->M + W8_A_ROW_PAD - 1) / W8_A_ROW_PAD * W8_A_ROW_PAD;
    const int64_t np1 = p->Kp / W8_KPAD + 1;
    const size_t q_bytes = w8_aligned((size_t)(mp * w8_row_stride(p->ops, p->Kp)));
    size_t fmt_off[W8_MAX_WEIGHTS], sums_off[W8_MAX_WEIGHTS], off = 0;
    for (int f = 0; f < p->nformats; f++) {
        fmt_off[f] = off;
        off += q_bytes + w8_aligned(p->fmt[f].row_sums ? (size_t)(p->M * np1) * sizeof(int32_t) : 0);
    }
    const size_t off_scale = off, off_status = off_scale + w8_aligned((size_t)p->M * sizeof(float));
    off = off_status + w8_aligned((size_t)p->M);
    for (int j = 0; j < nw; j++) {
        const size_t n = (size_t)(p->M * w[j].w->N);
        sums_off[j] = off;
        if (wide) off += w8_aligned(n * sizeof(int64_t));
        else if (glu && j == 1) off += w8_aligned(n * sizeof(int32_t));
    }
    const size_t off_rot = off;
    p->rot_stride = p->block ? (p->K + p->block - 1) / p->block * p->block : 0;
    p->rot_stride = (int64_t)(w8_aligned((size_t)p->rot_stride * sizeof(float)) / sizeof(float));
    const size_t total = off_rot + (size_t)p->rot_stride * sizeof(float) * (size_t)nworkers;
    if (base == NULL) return total;
    for (int f = 0; f < p->nformats; f++) {
        p->fmt[f].q = (uint8_t *)(base + fmt_off[f]);
        p->fmt[f].psum = (int32_t *)(base + fmt_off[f] + q_bytes);
    }
    p->a_scale = (float *)(base + off_scale);
    p->status = (uint8_t *)(base + off_status);
    p->rot = (float *)(base + off_rot);
    for (int j = 0; j < nw; j++) sums[j] = wide || (glu && j == 1) ? base + sums_off[j] : NULL;
    return total;
}

/* The loop nest of weight j (p->jobs[j], or p->up for a gated pair's up projection). */
static void w8_set_job(w8_product *p, int j, const w8_call_weight *cw, int f, int glu,
                       int wide, char *sums, int act)
{
    const w8_plan *w = cw->w;
    const int up = glu && j == 1;
    w8_gemm *g = up ? &p->up : &p->jobs[j].g;
    g->ops = p->ops, g->enc = w->enc, g->M = p->M, g->N = w->N, g->Kp = p->Kp;
    g->a = p->fmt[f].q, g->lda = w8_row_stride(p->ops, p->Kp);
    g->a_psum = p->fmt[f].row_sums ? p->fmt[f].psum : NULL;
    g->b = w->panels, g->b_psum = w->psum, g->a_scale = p->a_scale, g->b_scale = w->scales;
    g->bias = cw->bias;
    g->act = j == 0 ? act : W8_ACT_NONE;
    g->up = NULL;
    g->kc = cw->b.kc, g->mc = cw->b.mc, g->nc = cw->b.nc, g->prefetch = (int)cw->b.prefetch;
    p->wide_out[j] = NULL;
    if (up) { /* its raw sums, finished with the gate's tiles */
        g->out_kind = wide ? W8_OUT_I64 : W8_OUT_I32;
        g->out = sums, g->ldo = w->N;
        p->jobs[0].g.up = g;
        return;
    }
    g->out = cw->out, g->ldo = cw->ldo;
    g->out_kind = W8_OUT_F32;
    if (p->int8_input) {
        g->out_kind = cw->out_size == 8 ? W8_OUT_I64 : W8_OUT_I32;
    } else if (wide) { /* exact int32 sums per W8_EXACT_K-range, added in int64 */
        g->out_kind = W8_OUT_I64;
        p->wide_out[j] = (float *)g->out, p->wide_ldo[j] = g->ldo;
        g->out = sums, g->ldo = w->N;
    }
    p->jobs[j].m_step = cw->b.m_step, p->jobs[j].n_step = cw->b.n_step;
}

/* Sets up p (formats, scratch, jobs) in the scratch at `base`; with base NULL, only
 * measures it.  Returns the scratch's bytes. */
static size_t w8_set_up(w8_product *p, const w8_call *c, const w8_call_weight *w, int nw,
                        int nworkers, char *base)
{
    const w8_plan *w0 = w[0].w;
    const int glu = c->kind == W8_CALL_GLU;
    const int wide = !c->int8_input && w0->Kp > W8_EXACT_K;
    int fmt_of[W8_MAX_WEIGHTS];
    char *sums[W8_MAX_WEIGHTS];
    p->ops = (const w8_isa_ops *)c->isa, p->x = c->x, p->int8_input = c->int8_input;
    p->M = c->M, p->K = c->K, p->Kp = w0->Kp;
    p->block = w0->rotate && !c->int8_input ? w0->block : 0;
    p->signs = w0->signs;
    w8_assign_formats(p, w, nw, fmt_of);
    const size_t size = w8_lay_out_scratch(p, w, nw, glu, wide, nworkers, base, sums);
    if (base == NULL) return size;
    p->njobs = glu ? 1 : nw;
    for (int j = 0; j < nw; j++) w8_set_job(p, j, &w[j], fmt_of[j], glu, wide, sums[j], c->act);
    return size;
}

/* ---- the run ---- */

static int w8_finite(const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

/* What a call is refused for before it runs: W8_FAULT_NONE, or the fault in f. */
static int w8_call_fault(const w8_call *c, int nw, w8_fault *f)
{
    const w8_plan *w0 = c->plan[0], *w1 = c->plan[1];
    if (c->K != w0->K) return w8_fault_set(f, W8_FAULT_FEATURES, W8_ARG_X, c->K, w0->K, 0);
    if (nw == 2) {
        if (w1->K != w0->K) return w8_fault_set(f, W8_FAULT_OTHER_K, W8_ARG_W2, w0->K, w1->K, 0);
        if (c->kind == W8_CALL_GLU && w1->N != w0->N)
            return w8_fault_set(f, W8_FAULT_OTHER_N, W8_ARG_W2, w0->N, w1->N, 0);
        if (w1->rotate != w0->rotate ||
            (w0->rotate && (w1->block != w0->block || w1->seed != w0->seed))) {
            for (int j = 0; j < 2; j++) {
                f->rotation[j][0] = c->plan[j]->rotate;
                f->rotation[j][1] = c->plan[j]->block;
                f->rotation[j][2] = c->plan[j]->seed;
            }
            return w8_fault_set(f, W8_FAULT_OTHER_ROTATION, W8_ARG_W2, 0, 0, 0);
        }
    }
    if (c->act < W8_ACT_NONE || c->act > W8_ACT_SILU)
        return w8_fault_set(f, W8_FAULT_ACTIVATION, W8_ARG_X, c->act, 0, 0);
    for (int j = 0; j < nw; j++)
        if (c->bias[j] && !w8_finite(c->bias[j], c->plan[j]->N))
            return w8_fault_set(f, W8_FAULT_BIAS_NOT_FINITE, W8_ARG_B1 + j, 0, 0, 0);
    return W8_FAULT_NONE;
}

/* A float product of no features: every sum is 0, so the result is the bias, through the
 * same activation (and gate) arithmetic as a tile's, on the call's ISA. */
static void w8_featureless(const w8_call *c, int nw)
{
    const w8_isa_ops *ops = (const w8_isa_ops *)c->isa;
    w8_tile_finish fin;
    memset(&fin, 0, sizeof fin);
    fin.act = c->act;
    const int64_t n = c->plan[0]->N;
    for (int j = 0; j < (c->kind == W8_CALL_GLU ? 1 : nw); j++)
        for (int64_t m = 0; m < c->M; m++) {
            float *row = (float *)c->out[j] + m * c->ldo[j];
            for (int64_t i = 0; i < c->plan[j]->N; i++)
                row[i] = 0.0f + (c->bias[j] ? c->bias[j][i] : 0.0f); /* 0 + -0 is +0 */
            if (j == 0 && c->act && n) ops->act_tile(row, n, 1, (int)n, &fin);
            if (c->kind == W8_CALL_GLU)
                for (int64_t i = 0; i < n; i++) row[i] *= 0.0f + (c->bias[1] ? c->bias[1][i] : 0.0f);
        }
}

/* Each weight's blocking: the call's own, the plan's settled one, or the tuner's choice
 * (choice[j].index >= 0: a candidate to time).  0, or W8_FAULT_NO_MEMORY. */
static int w8_blockings(const w8_call *c, int nw, w8_call_weight *w, w8_tune_choice *choice,
                        uint64_t *generation)
{
    const int glu = c->kind == W8_CALL_GLU, tuned = glu ? 1 : nw;
    const w8_isa_id isa = w8_isa_id_of((const w8_isa_ops *)c->isa);
    for (int j = 0; j < nw; j++) choice[j].index = W8_TUNE_SETTLED;
    if (c->blocking) {
        const w8_blocking b = {c->blocking[0], c->blocking[1], c->blocking[2], c->blocking[3],
                               c->blocking[4], c->blocking[5]};
        w[0].b = w[1].b = b;
        return W8_FAULT_NONE;
    }
    w8_call_lock_take();
    *generation = w8_tuner_generation;
    for (int j = 0; j < tuned; j++) {
        w8_plan *plan = (w8_plan *)c->plan[j];
        if (w8_settled_blocking(plan, c->kind, isa, c->M, c->nthreads, &w[j].b)) continue;
        if (w8_tune_choose(&w8_call_tuner, (const w8_isa_ops *)c->isa, plan->enc, tuned, c->M,
                           plan->N, plan->Kp, c->nthreads, glu ? 2 : 1, &choice[j]) != 0) {
            w8_call_lock_give();
            return W8_FAULT_NO_MEMORY;
        }
        w[j].b = choice[j].blocking;
        if (choice[j].index == W8_TUNE_SETTLED)
            w8_remember_blocking(plan, c->kind, isa, c->M, c->nthreads, w[j].b);
    }
    w8_call_lock_give();
    if (glu) w[1].b = w[0].b; /* one loop nest, over the gate's blocking */
    return W8_FAULT_NONE;
}

static double w8_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The fault of the first failing row: finite and rotated, its rotation overflowed. */
static int w8_row_fault(const w8_call *c, int64_t bad, w8_fault *f)
{
    const int finite = w8_finite((const float *)c->x + bad * c->K, c->K);
    return w8_fault_set(f, c->plan[0]->rotate && finite ? W8_FAULT_ROW_ROTATION
                                                        : W8_FAULT_ROW_NOT_FINITE,
                        W8_ARG_X, bad, 0, 0);
}

/* Runs a call (call.h's run): W8_FAULT_NONE, or a fault, no output then written. */
static int w8_call_run(const w8_call *c, w8_fault *f)
{
    memset(f, 0, sizeof *f);
    const int nw = c->kind == W8_CALL_ONE ? 1 : 2;
    if (w8_call_fault(c, nw, f)) return f->code;
    if (c->M == 0 || (c->plan[0]->N == 0 && (nw == 1 || c->plan[1]->N == 0))) return 0;
    if (c->K == 0) {
        if (!c->int8_input) w8_featureless(c, nw);
        return 0;
    }
    w8_call_weight w[W8_MAX_WEIGHTS];
    w8_tune_choice choice[W8_MAX_WEIGHTS];
    uint64_t generation = 0;
    memset(w, 0, sizeof w);
    for (int j = 0; j < nw; j++) {
        w[j].w = c->plan[j], w[j].bias = c->bias[j];
        if (!(c->kind == W8_CALL_GLU && j == 1))
            w[j].out = c->out[j], w[j].ldo = c->ldo[j], w[j].out_size = c->out_size;
    }
    if (w8_blockings(c, nw, w, choice, &generation))
        return w8_fault_set(f, W8_FAULT_NO_MEMORY, W8_ARG_X, 0, 0, 0);
    const int timed = choice[0].index >= 0 || (nw == 2 && choice[1].index >= 0);
    const int nworkers = c->nthreads > 1 ? c->nthreads : 1;
    const double t0 = timed ? w8_seconds() : 0.0;
    w8_product p;
    const size_t bytes = w8_set_up(&p, c, w, nw, nworkers, NULL);
    char *base = (char *)w8_thread_scratch(bytes);
    if (base == NULL)
        return w8_fault_set(f, W8_FAULT_NO_MEMORY, W8_ARG_X, (int64_t)bytes, 0, 0);
    w8_set_up(&p, c, w, nw, nworkers, base);
    const int64_t bad = w8_run_product(&p, nworkers);
    if (timed) {
        const double elapsed = w8_seconds() - t0;
        w8_call_lock_take();
        for (int j = 0; j < nw && generation == w8_tuner_generation; j++)
            if (choice[j].index >= 0) w8_tune_record(choice[j].entry, choice[j].index, elapsed);
        w8_call_lock_give();
    }
    return bad >= 0 ? w8_row_fault(c, bad, f) : W8_FAULT_NONE;
}

/* The tuner's state, for the tests and the bench's warm-up. */
static int64_t w8_call_unsettled(void)
{
    w8_call_lock_take();
    const int64_t n = w8_tune_unsettled(&w8_call_tuner);
    w8_call_lock_give();
    return n;
}

static void w8_call_forget_tuning(void)
{
    w8_call_lock_take();
    w8_tune_clear(&w8_call_tuner);
    w8_tuner_generation++;
    w8_call_lock_give();
}

#endif
