/* The one call path of every product (matmul, matmul_pair, int8_matmul): the activation
 * rows are prepared once, in each format the call's weights read (quantized, rotated first
 * when the weights are, or copied when already int8), then every block of every product
 * runs, all in one parallel region, so a call wakes the thread team once:
 *
 *   parallel                     (each worker off its master's CPU: team.h)
 *     for each row (dynamic)     -> its bytes, scale and prefix sums; its status
 *     (barrier)                     (a single row: prepared before the region instead)
 *     unless a row failed:
 *       for each task (dynamic) -> w8_run_task: an m_step x n_step block of one product
 *
 * or, when each task owns its rows (one product split over M only, in as many tasks as
 * threads or more):
 *
 *   parallel
 *     for each task (static)    -> its rows prepared
 *     (barrier)
 *     unless a row failed:
 *       for each task (static)  -> its block, on the thread that prepared its rows
 *
 * Either way no output is written unless every row is good: a row that fails leaves the
 * outputs as they were (matmul's out= among them).
 *
 * The caller (_kernels.product) lays out the scratch and the jobs; this file trusts them. */
#ifndef PYW8A8_SIMD_PRODUCT_H
#define PYW8A8_SIMD_PRODUCT_H

#include "common.h"
#include "gemm_loops.h"
#include "quant.h"
#include "team.h"
#if defined(_OPENMP)
#include <omp.h>
#define W8_OMP(directive) _Pragma(#directive)
#else
#define W8_OMP(directive)
#endif

#define W8_MAX_WEIGHTS 2 /* one product, or two sharing their activations (matmul_pair) */

/* The activation rows as the kernels of one weight encoding read them. */
typedef struct {
    uint8_t flip;  /* XOR applied to the signed bytes (the +128 shift of W8_CORR_COL) */
    int row_sums;  /* whether its kernels need the rows' prefix sums (W8_CORR_ROW / NEG) */
    uint8_t *q;    /* Mp rows of Kp values, W8_A_BYTES each, w8_row_stride apart */
    int32_t *psum; /* M x (Kp / 64 + 1), when row_sums */
} w8_row_format;

typedef struct {
    const w8_isa_ops *ops;
    const void *x;           /* M x K, C order: float32, or int8 when int8_input */
    int int8_input;
    int64_t M, K, Kp;
    int64_t block;           /* > 0: float rows are rotated first (K padded to a block) */
    const float *signs;      /* K: the rotation's sign table (w8_sign_table), when block */
    w8_row_format fmt[W8_MAX_WEIGHTS];
    int nformats;
    float *a_scale;          /* M */
    uint8_t *status;         /* M: 0, or 1 for a row holding NaN/Inf or overflowing */
    float *rot;              /* one rotation row per thread, rot_stride floats apart */
    int64_t rot_stride;
    w8_gemm_job jobs[W8_MAX_WEIGHTS];
    int njobs;
    w8_gemm up;         /* a gated pair: the up projection of jobs[0] (its .up) */
    float *wide_out[W8_MAX_WEIGHTS]; /* a float product beyond W8_EXACT_K: its output */
    int64_t wide_ldo[W8_MAX_WEIGHTS];
} w8_product;

/* Row i in every format: its quantized bytes (signed values XOR the format's flip) and
 * prefix sums, then, where the ISA's kernels read wider rows, the row expanded from those
 * bytes, which go to its last Kp bytes for that (w8_expand_row_fn).  Returns 0, or 1 when
 * the row holds NaN/Inf or its rotation overflows. */
static inline uint8_t w8_prepare_row(const w8_product *p, int64_t i, float *rot)
{
    const w8_row_format *f0 = &p->fmt[0];
    const int64_t np1 = p->Kp / W8_KPAD + 1, stride = w8_row_stride(p->ops, p->Kp);
    /* the row's quantized bytes: its last Kp of W8_A_BYTES * Kp (expand_row's input) */
    const int64_t at = i * stride + (W8_A_BYTES(p->ops) - 1) * p->Kp;
    uint8_t *q = f0->q + at;
    int32_t *psum = f0->row_sums ? f0->psum + i * np1 : NULL;
    if (p->int8_input) {
        w8_load_int8_row(p->ops, (const int8_t *)p->x + i * p->K, p->K, p->Kp, f0->flip, q, psum);
    } else {
        const float *x = (const float *)p->x + i * p->K;
        const int bad = p->block
            ? w8_quantize_row_rotated(p->ops, x, p->K, p->Kp, f0->flip, q, p->a_scale + i,
                                      psum, p->block, p->signs, rot)
            : w8_quantize_row(p->ops, x, p->K, p->Kp, f0->flip, q, p->a_scale + i, psum);
        if (bad) return 1;
    }
    /* Another format differs only in its XOR (the signed values, and so their sums, are
     * the same): derived from the first rather than quantized again. */
    for (int f = 1; f < p->nformats; f++) {
        const w8_row_format *fo = &p->fmt[f];
        const uint8_t delta = fo->flip ^ f0->flip;
        uint8_t *qo = fo->q + at;
        for (int64_t k = 0; k < p->Kp; k++) qo[k] = q[k] ^ delta;
        if (fo->row_sums) p->ops->prefix_sums(qo, p->Kp, fo->flip, fo->psum + i * np1);
    }
    if (p->ops->expand_row)
        for (int f = 0; f < p->nformats; f++)
            p->ops->expand_row(p->fmt[f].q + i * stride, p->Kp, p->fmt[f].flip);
    return 0;
}

static inline int64_t w8_first_bad_row(const w8_product *p)
{
    for (int64_t i = 0; i < p->M; i++)
        if (p->status[i]) return i;
    return -1;
}

/* Whether each task owns its rows: one product split over M only, every task's block
 * spanning all the columns, in at least as many tasks as threads.  The thread that
 * multiplies a row block prepares it too, on its own core: the rows are in that core's
 * L2 when its kernels read them, not in the other core's (rows prepared by any thread,
 * then read across cores, made 1024 x 2048 x 640 1.15x slower on an AMX Xeon).  With
 * fewer tasks than threads, a thread would prepare every row of a call alone while the
 * others wait. */
static inline int w8_tasks_own_rows(const w8_product *p, int64_t ntasks, int nthreads)
{
    return ntasks >= nthreads && p->njobs == 1 && p->jobs[0].n_step >= p->jobs[0].g.N;
}

/* The rows of task t of a product whose tasks own their rows. */
static inline void w8_prepare_task_rows(w8_product *p, int64_t t, float *rot)
{
    int64_t m0, m1, n0, n1;
    w8_task_block(&p->jobs[0], t, &m0, &m1, &n0, &n1);
    for (int64_t i = m0; i < m1; i++) p->status[i] = w8_prepare_row(p, i, rot);
}

/* The block of task t of a product whose tasks own their rows. */
static inline void w8_run_task_block(w8_product *p, int64_t t)
{
    int64_t m0, m1, n0, n1;
    w8_task_block(&p->jobs[0], t, &m0, &m1, &n0, &n1);
    w8_gemm_range(&p->jobs[0].g, m0, m1, n0, n1);
}

/* A product whose tasks own their rows, the calling thread's share of it: its tasks'
 * rows, then, once every thread has checked its rows, its tasks' blocks.  Both loops are
 * static over the same tasks, which OpenMP deals to the threads alike, so a block runs on
 * the thread that prepared its rows; the barrier between them keeps a failed row from
 * any output (matmul's out= included), at no cost measurable on the Zen 4. */
static inline void w8_run_owning_tasks(w8_product *p, int64_t ntasks, float *rot)
{
    W8_OMP(omp for schedule(static))
    for (int64_t t = 0; t < ntasks; t++) w8_prepare_task_rows(p, t, rot);
    if (w8_first_bad_row(p) < 0) {
        W8_OMP(omp for schedule(static))
        for (int64_t t = 0; t < ntasks; t++) w8_run_task_block(p, t);
    }
}

/* Runs the product(s) on `nthreads` threads (1: no parallel region at all, since waking a
 * team costs more than a small product).  Returns -1, or the first row that failed (the
 * outputs then untouched). */
static inline int64_t w8_run_product(w8_product *p, int nthreads)
{
    const int64_t ntasks = w8_number_tasks(p->jobs, p->njobs);
    const int own_rows = nthreads > 1 && w8_tasks_own_rows(p, ntasks, nthreads);
    /* The calling thread prepares the rows first where one thread prepares them either
     * way: on one thread, and for a single row, which then costs the team no barrier
     * (1 x 640 x 2048 ran 1.15x as fast, Zen 4, 2 threads). */
    const int rows_first = nthreads <= 1 || (!own_rows && p->M == 1);
    if (rows_first)
        for (int64_t i = 0; i < p->M; i++) p->status[i] = w8_prepare_row(p, i, p->rot);
    if (nthreads <= 1) {
        if (w8_first_bad_row(p) < 0) {
            w8_task_begin(p->ops);
            for (int64_t t = 0; t < ntasks; t++) w8_run_task(p->jobs, p->njobs, t);
            w8_task_end(p->ops);
        }
    } else {
        const w8_master_place master = w8_master_here();
        W8_OMP(omp parallel num_threads(nthreads))
        {
#if defined(_OPENMP)
            float *rot = p->rot + (int64_t)omp_get_thread_num() * p->rot_stride;
#else
            float *rot = p->rot;
#endif
            w8_join_team(master);
            if (own_rows) {
                w8_task_begin(p->ops);
                w8_run_owning_tasks(p, ntasks, rot);
                w8_task_end(p->ops);
            } else {
                if (!rows_first) {
                    W8_OMP(omp for schedule(dynamic))
                    for (int64_t i = 0; i < p->M; i++)
                        p->status[i] = w8_prepare_row(p, i, rot);
                }
                /* The loop's barrier: every thread reads the same statuses, so all of
                 * them run the product or none does. */
                if (w8_first_bad_row(p) < 0) {
                    w8_task_begin(p->ops); /* once per thread and call (AMX: the tiles) */
                    W8_OMP(omp for schedule(dynamic))
                    for (int64_t t = 0; t < ntasks; t++) w8_run_task(p->jobs, p->njobs, t);
                    w8_task_end(p->ops);
                }
            }
        }
    }
    const int64_t bad = w8_first_bad_row(p);
    if (bad < 0)
        for (int j = 0; j < p->njobs; j++)
            if (p->wide_out[j]) w8_finish_wide(&p->jobs[j].g, p->wide_out[j], p->wide_ldo[j]);
    return bad;
}

#undef W8_OMP
#endif
