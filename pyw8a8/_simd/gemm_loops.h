/* The blocked GEMM loop nest, written once for every microkernel (GotoBLAS / MMLoops):
 *
 *   for nc-block of N   (the B block of one task's columns, sized from L2/L3)
 *     for kc-range of K  (the B micro-panel of one range stays in L1)
 *       for mc-block of M (the A block reused from L2 across the panels)
 *         for 16*npanels columns (one B micro-panel)
 *           for mr rows     -> microkernel, adding into the int32 sums of its tile
 *                              (over the last K-range the kernel finishes its tile to
 *                              float in registers, or the epilogue follows, on a group
 *                              of tiles: w8_finish_tiles)
 *
 * Results do not depend on the blocking: the int32 sums of a tile are exact (W8_EXACT_K in
 * common.h) and kept in the output buffer itself across K-ranges (an int32 has a float's
 * size), and the float epilogue runs once, on the whole sum.  A product with K beyond
 * W8_EXACT_K takes the int64 output (w8_gemm_range_i64): one exact int32 sum per
 * W8_EXACT_K-range, compensated and added in int64; the caller converts that once.
 *
 * Pure C: the ISA lives only in the registry entry, so the Arm build reuses it unchanged. */
#ifndef PYW8A8_SIMD_GEMM_LOOPS_H
#define PYW8A8_SIMD_GEMM_LOOPS_H

#include "common.h"
#include "scalar.h"

/* One GEMM of a call (its weight's; a call holds one or two): operands, output and
 * blocking.  (A weight's "plan" is its Python-side half, _kernels.WeightPlan.) */
typedef struct w8_gemm_s {
    const w8_isa_ops *ops;
    int enc;                 /* W8_ENC_* of the packed weight */
    int64_t M, N, Kp;
    const uint8_t *a;        /* quantized activations, M rows of Kp values (stride lda bytes,
                                W8_A_BYTES a value), in
                                a buffer of M rounded up to W8_A_ROW_PAD rows */
    int64_t lda;
    const int32_t *a_psum;   /* M x (Kp/64 + 1) prefix sums, for W8_CORR_ROW / NEG */
    const uint8_t *b;        /* packed weight panels */
    const int32_t *b_psum;   /* Np x (Kp/64 + 1) prefix sums, for W8_CORR_COL */
    const float *a_scale;    /* M, for W8_OUT_F32 */
    const float *b_scale;    /* N, for W8_OUT_F32 */
    const float *bias;       /* N, or NULL: added to the float result (W8_OUT_F32) */
    int act;                 /* W8_ACT_* applied after the bias (W8_OUT_F32) */
    /* A gated pair (W8_OUT_F32, or W8_OUT_I64 beyond W8_EXACT_K): the up projection, a GEMM
     * of the same M, N, Kp and blocking whose `out` holds its raw sums (int32, or int64
     * for W8_OUT_I64); each tile of this GEMM (the gate) is finished as act(gate) * up.
     * NULL otherwise. */
    const struct w8_gemm_s *up;
    int out_kind;            /* W8_OUT_*; F32 and I32 need Kp <= W8_EXACT_K */
    void *out;               /* M x N, row stride ldo elements */
    int64_t ldo;
    int64_t kc, mc, nc;      /* blocking: kc multiple of 64, mc of mr, nc of 16 */
    int prefetch;            /* the ISA's prefetching kernels, where it has them */
} w8_gemm;

/* The kernel of a tile of g: the ISA's, or its prefetching one where g asks, the ISA has
 * one and the tile is the first of its strip (`first_row`: the strip's later row tiles
 * read the panels the first brought in, so each line is prefetched once).  The same sums
 * either way. */
static inline w8_ukernel_fn w8_kernel_of(const w8_gemm *g, int first_row)
{
    const w8_ukernel_fn ahead =
        g->prefetch && first_row ? g->ops->ukernel_prefetch[g->enc] : NULL;
    return ahead ? ahead : g->ops->ukernel[g->enc];
}

/* The same for the kernel that finishes tiles (NULL where the ISA has none). */
static inline w8_ukernel_f32_fn w8_kernel_f32_of(const w8_gemm *g, int first_row)
{
    const w8_ukernel_f32_fn ahead =
        g->prefetch && first_row ? g->ops->ukernel_f32_prefetch[g->enc] : NULL;
    return ahead ? ahead : g->ops->ukernel_f32[g->enc];
}

/* Row m of the activations from K value k0 on, as the ISA's kernels read it. */
static inline const uint8_t *w8_a_at(const w8_gemm *g, int64_t m, int64_t k0)
{
    return g->a + m * g->lda + k0 * W8_A_BYTES(g->ops);
}

/* factor * (the sum over [k0, k1) of row `row` of a prefix-sum table), modulo 2^32: the
 * compensation over that K-range (128 for the +128 encodings, 1 for W8_CORR_NEG). */
static inline int32_t w8_compensation(const int32_t *psum, int64_t Kp, int64_t row,
                                      int64_t k0, int64_t k1, uint32_t factor)
{
    const int32_t *ps = psum + row * (Kp / W8_KPAD + 1);
    return (int32_t)(factor * ((uint32_t)ps[k1 / W8_KPAD] - (uint32_t)ps[k0 / W8_KPAD]));
}

/* The corrections over [k0, k1) of rows [m, m + rows), for an ISA whose correction reads
 * rows (W8_CORR_READS_ROWS). */
static inline void w8_row_corrections(const w8_gemm *g, int64_t m, int rows, int64_t k0,
                                      int64_t k1, int32_t *row_corr)
{
    const uint32_t factor = g->ops->corr[g->enc] == W8_CORR_NEG ? 1 : 128;
    for (int r = 0; r < rows; r++)
        row_corr[r] = w8_compensation(g->a_psum, g->Kp, m + r, k0, k1, factor);
}

/* The corrections of a rows x cols tile at (m, n) over [k0, k1); NULL when none. */
static void w8_tile_corrections(const w8_gemm *g, int64_t m, int rows, int64_t n,
                                int cols, int64_t k0, int64_t k1, int32_t *row_corr,
                                int32_t *col_corr, const int32_t **rc, const int32_t **cc)
{
    const int corr = g->ops->corr[g->enc];
    *rc = *cc = NULL;
    if (W8_CORR_READS_ROWS(corr)) {
        w8_row_corrections(g, m, rows, k0, k1, row_corr);
        *rc = row_corr;
    } else if (corr == W8_CORR_COL) {
        for (int j = 0; j < cols; j++)
            col_corr[j] = w8_compensation(g->b_psum, g->Kp, n + j, k0, k1, 128);
        *cc = col_corr;
    }
}

/* The corrections of one product's tile, where a w8_scaling points. */
typedef struct {
    int32_t row[W8_MAX_MR], col[W8_TILE_LD];
} w8_corrections;

static void w8_scaling_at(const w8_gemm *g, int64_t m, int rows, int64_t n, int cols,
                          w8_corrections *buf, w8_scaling *s)
{
    w8_tile_corrections(g, m, rows, n, cols, 0, g->Kp, buf->row, buf->col, &s->row_corr,
                        &s->col_corr);
    s->a_scale = g->a_scale + m;
    s->b_scale = g->b_scale + n;
    s->bias = g->bias ? g->bias + n : NULL;
}

/* The finish of a W8_OUT_F32 GEMM's tile at (m, n), its corrections in buf[0] (and those
 * of the up projection in buf[1]). */
static void w8_finish_at(const w8_gemm *g, int64_t m, int rows, int64_t n, int cols,
                         w8_corrections buf[2], w8_tile_finish *fin)
{
    memset(fin, 0, sizeof(*fin));
    w8_scaling_at(g, m, rows, n, cols, &buf[0], &fin->g);
    fin->act = g->act;
    if (g->up) {
        w8_scaling_at(g->up, m, rows, n, cols, &buf[1], &fin->u);
        fin->up = (const int32_t *)g->up->out + m * g->up->ldo + n;
        fin->ld_up = g->up->ldo;
    }
}

/* A finish set up for the tile at (m0, n) (w8_finish_at) moved down its strip to the
 * tile of rows [m, m + rows): only what depends on the rows changes (their scales, their
 * corrections where the ISA's correction reads rows, the up projection's tile); the
 * columns' parts (scales, bias, column corrections) stay.  Set up once per strip rather
 * than per tile: a tile at K = 384 is some 1000 cycles of kernel, and the finish's setup
 * (the struct cleared, every correction recomputed) a tenth of that. */
static inline void w8_finish_move_rows(const w8_gemm *g, int64_t m, int rows, int64_t n,
                                       w8_corrections buf[2], w8_tile_finish *fin)
{
    fin->g.a_scale = g->a_scale + m;
    if (fin->g.row_corr) w8_row_corrections(g, m, rows, 0, g->Kp, buf[0].row);
    if (g->up) {
        fin->u.a_scale = g->up->a_scale + m;
        if (fin->u.row_corr) w8_row_corrections(g->up, m, rows, 0, g->Kp, buf[1].row);
        fin->up = (const int32_t *)g->up->out + m * g->up->ldo + n;
    }
}

/* A tile's final int32 sums (raw, in the output buffer) -> its float or int32 result. */
static void w8_finish_tile(const w8_gemm *g, int32_t *sums, int64_t m, int rows,
                           int64_t n, int cols)
{
    if (g->out_kind == W8_OUT_F32) {
        w8_corrections buf[2];
        w8_tile_finish fin;
        w8_finish_at(g, m, rows, n, cols, buf, &fin);
        g->ops->epilogue(sums, g->ldo, rows, cols, &fin, (float *)sums, g->ldo);
        if (fin.act || fin.up) g->ops->act_tile((float *)sums, g->ldo, rows, cols, &fin);
        return;
    }
    int32_t row_corr[W8_MAX_MR], col_corr[W8_TILE_LD];
    const int32_t *rc, *cc;
    w8_tile_corrections(g, m, rows, n, cols, 0, g->Kp, row_corr, col_corr, &rc, &cc);
    /* One plain loop per kind of correction, each vectorized: with the choice inside the
     * loop, an int32 output's finish took as long as its kernel (1 ns an element: 1024 x
     * 128 x 256, AMX). */
    for (int r = 0; r < rows; r++) {
        int32_t *s = sums + r * g->ldo;
        const uint32_t row = rc ? (uint32_t)rc[r] : 0;
        if (cc) {
            for (int j = 0; j < cols; j++)
                s[j] = (int32_t)((uint32_t)s[j] - row - (uint32_t)cc[j]);
        } else if (rc) {
            for (int j = 0; j < cols; j++) s[j] = (int32_t)((uint32_t)s[j] - row);
        }
    }
}

/* Adds (or stores, when !accumulate) a scratch tile's rows x cols sums into c. */
static void w8_merge_tile(int32_t *c, int64_t ldc, const int32_t *tile, int rows, int cols,
                          int accumulate)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            const uint32_t t = (uint32_t)tile[r * W8_TILE_LD + j];
            c[r * ldc + j] = (int32_t)(accumulate ? (uint32_t)c[r * ldc + j] + t : t);
        }
}

/* One kernel call of GEMM g over the tile at (m, n) and the K-range [k0, k0 + 4 kq), into
 * its sums at c (row stride ldc): an edge tile (`edge`: fewer columns than the kernel
 * writes, or fewer rows than a whole-tile kernel stores) through the scratch tile;
 * `first_row` as w8_kernel_of's. */
static inline void w8_tile_sums(const w8_gemm *g, int64_t m, int rows, int64_t n,
                                int cols, int64_t k0, int64_t kq, int32_t *c, int64_t ldc,
                                int first, int edge, int first_row, int32_t *tile)
{
    const int64_t ps = g->Kp / 4 * W8_QUAD_BYTES; /* bytes of one panel */
    const int npanels = (cols + W8_NR - 1) / W8_NR;
    const uint8_t *bp = g->b + (n / W8_NR) * ps + k0 / 4 * W8_QUAD_BYTES;
    const uint8_t *am = w8_a_at(g, m, k0);
    const w8_ukernel_fn kernel = w8_kernel_of(g, first_row);
    if (edge) {
        kernel(rows, npanels, kq, am, g->lda, bp, ps, tile, W8_TILE_LD, 0);
        w8_merge_tile(c, ldc, tile, rows, cols, !first);
    } else {
        kernel(rows, npanels, kq, am, g->lda, bp, ps, c, ldc, !first);
    }
}

/* The rows of the tiles an ISA's kernel stores for a row block of `rows` rows, set for the
 * calls that follow (the ISA's tile_rows): all of them where the block is one tile, so the
 * kernel stores straight into the output; mr otherwise, since setting them per call would
 * cost more (AMX: 75 ns a configuration) than the scratch tile of the block's last tile. */
static inline int w8_block_tile_rows(const w8_isa_ops *ops, int64_t rows)
{
    if (!ops->tile_rows) return ops->mr;
    const int tile = (int)(rows < ops->mr ? rows : ops->mr);
    ops->tile_rows(tile);
    return tile;
}

/* Finishes the tiles over C[m0:m1, n0:n1] whose last kernel call stored their raw sums. */
static void w8_finish_tiles(const w8_gemm *g, int64_t m0, int64_t m1, int64_t n0,
                            int64_t n1)
{
    const int64_t ncols = (int64_t)W8_NR * g->ops->npanels;
    for (int64_t n = n0; n < n1; n += ncols) {
        const int cols = (int)(n1 - n < ncols ? n1 - n : ncols);
        for (int64_t m = m0; m < m1; m += g->ops->mr) {
            const int rows = (int)(m1 - m < g->ops->mr ? m1 - m : g->ops->mr);
            w8_finish_tile(g, (int32_t *)g->out + m * g->ldo + n, m, rows, n, cols);
        }
    }
}

/* Output bytes of tiles whose finish waits: tiles that the kernel does not finish itself are
 * finished together, once that many bytes of them are stored or the block ends.  Finished
 * one by one between two AMX kernel calls, each tile's loads (corrections, scales, the sums
 * just stored) wait behind the weight stream and hold up the next call's tile loads (8 x
 * 1152 x 6912 took 1.12x as long, 2 Xeon vCPUs). */
#define W8_FINISH_BYTES 32768

/* The loop nest of a W8_OUT_F32 or W8_OUT_I32 GEMM, one function per level: the blocks
 * (nc columns, kc of K, mc rows: w8_gemm_range_i32), a row block's strips of the kernel's
 * width (w8_row_block), a strip's tiles (w8_strip_tiles). */

/* The K-range [k0, k1) of the tiles of rows [mb, mb1) in the columns [n, n + cols): one
 * kernel call per tile (after the up projection's, for a gated pair), finished in the
 * kernel's registers where `kernel_finishes`. */
static void w8_strip_tiles(const w8_gemm *g, int64_t mb, int64_t mb1, int tile_rows,
                           int64_t n, int cols, int64_t k0, int64_t k1, int kernel_finishes,
                           int32_t *tile)
{
    const w8_isa_ops *ops = g->ops;
    const int first = k0 == 0, npanels = (cols + W8_NR - 1) / W8_NR;
    const int part_cols = cols < npanels * W8_NR;
    const int64_t kq = (k1 - k0) / 4, ps = g->Kp / 4 * W8_QUAD_BYTES;
    w8_corrections buf[2];
    w8_tile_finish fin;
    if (kernel_finishes)
        w8_finish_at(g, mb, (int)(mb1 - mb < ops->mr ? mb1 - mb : ops->mr), n, cols, buf, &fin);
    for (int64_t m = mb; m < mb1; m += ops->mr) {
        const int rows = (int)(mb1 - m < ops->mr ? mb1 - m : ops->mr);
        const int edge = part_cols || (ops->whole_tiles && rows < tile_rows);
        int32_t *c = (int32_t *)g->out + m * g->ldo + n; /* the output holds the sums */
        /* A gated pair: the up projection's sums of the tile first, so they are at hand
         * (in L1) when the gate's tile is finished. */
        if (g->up)
            w8_tile_sums(g->up, m, rows, n, cols, k0, kq,
                         (int32_t *)g->up->out + m * g->up->ldo + n, g->up->ldo, first,
                         edge, m == mb, tile);
        if (kernel_finishes) {
            w8_finish_move_rows(g, m, rows, n, buf, &fin);
            w8_kernel_f32_of(g, m == mb)(rows, npanels, kq, w8_a_at(g, m, k0), g->lda,
                                     g->b + (n / W8_NR) * ps + k0 / 4 * W8_QUAD_BYTES, ps,
                                     c, g->ldo, !first, &fin);
            if (fin.act || fin.up) ops->act_tile((float *)c, g->ldo, rows, cols, &fin);
        } else {
            w8_tile_sums(g, m, rows, n, cols, k0, kq, c, g->ldo, first, edge, m == mb, tile);
        }
    }
}

/* The K-range [k0, k1) of the row block [mb, mb1) over the columns [nb, nb1), strip by
 * strip; in the last K-range, the tiles the kernel did not finish are finished
 * W8_FINISH_BYTES of them at a time. */
static void w8_row_block(const w8_gemm *g, int64_t mb, int64_t mb1, int64_t nb,
                         int64_t nb1, int64_t k0, int64_t k1, int32_t *tile)
{
    const w8_isa_ops *ops = g->ops;
    const int last = k1 == g->Kp, tile_rows = w8_block_tile_rows(ops, mb1 - mb);
    const int64_t ncols = (int64_t)W8_NR * ops->npanels;
    /* The kernel finishes whole strips' tiles (in registers, or from a block in L1 where
     * it stores whole tiles: AMX): one float store instead of an int32 store and an
     * epilogue pass over it.  A kernel storing whole tiles does so only in blocks of more
     * than two row tiles, which reuse each strip from L1: in fewer, the weight streams
     * from beyond L2 and the epilogue between two calls holds up the next call's tile
     * loads (8 x 1152 x 6912 took 1.1x as long, 64 x 1152 x 6912 1.03x; 2 Xeon vCPUs). */
    const int kernel_can_finish = last && g->out_kind == W8_OUT_F32 &&
                                  ops->ukernel_f32[g->enc] &&
                                  (!ops->whole_tiles || mb1 - mb > 2 * ops->mr);
    int64_t unfinished = nb; /* the block's columns from here on wait */
    for (int64_t n = nb; n < nb1; n += ncols) {
        const int cols = (int)(nb1 - n < ncols ? nb1 - n : ncols);
        const int kernel_finishes = kernel_can_finish && cols % W8_NR == 0;
        w8_strip_tiles(g, mb, mb1, tile_rows, n, cols, k0, k1, kernel_finishes, tile);
        if (!last) continue;
        if (kernel_finishes) {
            if (unfinished < n) w8_finish_tiles(g, mb, mb1, unfinished, n);
            unfinished = n + cols;
        } else if ((mb1 - mb) * (n + cols - unfinished) * 4 >= W8_FINISH_BYTES) {
            w8_finish_tiles(g, mb, mb1, unfinished, n + cols);
            unfinished = n + cols;
        }
    }
    if (last && unfinished < nb1) w8_finish_tiles(g, mb, mb1, unfinished, nb1);
}

/* C[m0:m1, n0:n1] of a W8_OUT_F32 or W8_OUT_I32 GEMM; n0 is a multiple of 16. */
static void w8_gemm_range_i32(const w8_gemm *g, int64_t m0, int64_t m1, int64_t n0,
                              int64_t n1)
{
    W8_ALIGN(64) int32_t tile[W8_MAX_MR * W8_TILE_LD];
    for (int64_t nb = n0; nb < n1; nb += g->nc) {
        const int64_t nb1 = nb + g->nc < n1 ? nb + g->nc : n1;
        for (int64_t k0 = 0; k0 < g->Kp; k0 += g->kc) {
            const int64_t k1 = k0 + g->kc < g->Kp ? k0 + g->kc : g->Kp;
            for (int64_t mb = m0; mb < m1; mb += g->mc)
                w8_row_block(g, mb, mb + g->mc < m1 ? mb + g->mc : m1, nb, nb1, k0, k1,
                             tile);
        }
    }
}

/* C[m0:m1, n0:n1] of a W8_OUT_I64 GEMM, any K: per W8_EXACT_K-range, one kernel call per
 * tile sums the range into the scratch tile, compensated and added to the int64 output. */
static void w8_gemm_range_i64(const w8_gemm *g, int64_t m0, int64_t m1, int64_t n0,
                              int64_t n1)
{
    const w8_isa_ops *ops = g->ops;
    const int64_t ps = g->Kp / 4 * W8_QUAD_BYTES;
    const int64_t ncols = (int64_t)W8_NR * ops->npanels;
    int64_t *const out = (int64_t *)g->out;
    W8_ALIGN(64) int32_t tile[W8_MAX_MR * W8_TILE_LD];
    int32_t row_corr[W8_MAX_MR], col_corr[W8_TILE_LD];
    w8_block_tile_rows(ops, m1 - m0); /* every tile goes through the scratch tile */
    for (int64_t k0 = 0; k0 < g->Kp; k0 += W8_EXACT_K) {
        const int64_t k1 = k0 + W8_EXACT_K < g->Kp ? k0 + W8_EXACT_K : g->Kp;
        for (int64_t n = n0; n < n1; n += ncols) {
            const int cols = (int)(n1 - n < ncols ? n1 - n : ncols);
            const int npanels = (cols + W8_NR - 1) / W8_NR;
            const uint8_t *bp = g->b + (n / W8_NR) * ps + k0 / 4 * W8_QUAD_BYTES;
            for (int64_t m = m0; m < m1; m += ops->mr) {
                const int rows = (int)(m1 - m < ops->mr ? m1 - m : ops->mr);
                const int32_t *rc, *cc;
                w8_kernel_of(g, m == m0)(rows, npanels, (k1 - k0) / 4, w8_a_at(g, m, k0),
                                         g->lda, bp, ps, tile, W8_TILE_LD, 0);
                w8_tile_corrections(g, m, rows, n, cols, k0, k1, row_corr, col_corr, &rc,
                                    &cc);
                for (int r = 0; r < rows; r++)
                    for (int j = 0; j < cols; j++) {
                        const int32_t v = (int32_t)((uint32_t)tile[r * W8_TILE_LD + j] -
                                                    (uint32_t)(rc ? rc[r] : 0) -
                                                    (uint32_t)(cc ? cc[j] : 0));
                        int64_t *o = out + (m + r) * g->ldo + n + j;
                        *o = k0 == 0 ? v : *o + v;
                    }
            }
        }
    }
}

/* C[m0:m1, n0:n1] for one task, on the calling thread; n0 is a multiple of 16.  The thread
 * has run its ISA's task_begin (once per call, however many tasks it takes). */
static inline void w8_gemm_range(const w8_gemm *g, int64_t m0, int64_t m1, int64_t n0,
                          int64_t n1)
{
    if (m0 >= m1 || n0 >= n1) return;
    if (g->out_kind == W8_OUT_I64) {
        w8_gemm_range_i64(g, m0, m1, n0, n1);
        if (g->up) w8_gemm_range_i64(g->up, m0, m1, n0, n1);
    } else {
        w8_gemm_range_i32(g, m0, m1, n0, n1);
    }
}

/* One product of a call (a call holds one, or two sharing their activations: matmul_pair)
 * and its task split: blocks of m_step rows x n_step columns (n_step a multiple of 16),
 * numbered in row-major order from first_task on. */
typedef struct {
    w8_gemm g;
    int64_t m_step, n_step;
    int64_t first_task;
} w8_gemm_job;

/* Tasks of a job: 0 when its product is empty. */
static inline int64_t w8_job_tasks(const w8_gemm_job *j)
{
    if (j->g.M == 0 || j->g.N == 0 || j->g.Kp == 0) return 0;
    return ((j->g.M + j->m_step - 1) / j->m_step) * ((j->g.N + j->n_step - 1) / j->n_step);
}

/* Numbers the tasks of the jobs one after the other; returns their total. */
static inline int64_t w8_number_tasks(w8_gemm_job *jobs, int njobs)
{
    int64_t total = 0;
    for (int j = 0; j < njobs; j++) {
        jobs[j].first_task = total;
        total += w8_job_tasks(&jobs[j]);
    }
    return total;
}

/* The block C[m0:m1, n0:n1] of task `local` of a job (numbered from 0 within it). */
static inline void w8_task_block(const w8_gemm_job *job, int64_t local, int64_t *m0,
                                 int64_t *m1, int64_t *n0, int64_t *n1)
{
    const int64_t n_blocks = (job->g.N + job->n_step - 1) / job->n_step;
    *m0 = (local / n_blocks) * job->m_step;
    *n0 = (local % n_blocks) * job->n_step;
    *m1 = *m0 + job->m_step < job->g.M ? *m0 + job->m_step : job->g.M;
    *n1 = *n0 + job->n_step < job->g.N ? *n0 + job->n_step : job->g.N;
}

/* Task t of the numbered jobs, on the calling thread (any thread, any order: tasks write
 * disjoint blocks of the outputs). */
static inline void w8_run_task(const w8_gemm_job *jobs, int njobs, int64_t t)
{
    int j = 0;
    while (j + 1 < njobs && t >= jobs[j + 1].first_task) j++;
    int64_t m0, m1, n0, n1;
    w8_task_block(&jobs[j], t - jobs[j].first_task, &m0, &m1, &n0, &n1);
    w8_gemm_range(&jobs[j].g, m0, m1, n0, n1);
}

/* One int64 sum of a product beyond W8_EXACT_K (its GEMM's `out`) scaled: one conversion
 * (round to nearest, as numpy's), then w8_apply_scales and the bias, as w8_scalar_scaled
 * does for the int32 sums of every tile. */
static inline float w8_wide_scaled(const w8_gemm *g, int64_t m, int64_t n)
{
    const float v = w8_apply_scales((float)((const int64_t *)g->out)[m * g->ldo + n],
                                    g->a_scale[m], g->b_scale[n]);
    return g->bias ? v + g->bias[n] : v;
}

/* The float result of a product beyond W8_EXACT_K: its scaled sums, then the activation and
 * gate in the order of every tile's finish, through the scalar reference. */
static inline void w8_finish_wide(const w8_gemm *g, float *out, int64_t ldo)
{
    for (int64_t m = 0; m < g->M; m++)
        for (int64_t n = 0; n < g->N; n++) {
            float v = w8_wide_scaled(g, m, n);
            if (g->act) v = w8_scalar_activate(v, g->act);
            if (g->up) v = v * w8_wide_scaled(g->up, m, n);
            out[m * ldo + n] = v;
        }
}

static inline void w8_task_begin(const w8_isa_ops *ops)
{
    if (ops->task_begin) ops->task_begin();
}

static inline void w8_task_end(const w8_isa_ops *ops)
{
    if (ops->task_end) ops->task_end();
}

#endif
