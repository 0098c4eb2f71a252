/* The blocked GEMM loop nest, written once for every microkernel (GotoBLAS / MMLoops):
 *
 *   for nc-block of N   (the B block of one task's columns, sized from L2/L3)
 *     for kc-range of K  (int32 accumulation within it; floats across ranges: no overflow)
 *       for mc-block of M (the A block reused from L2 across the panels)
 *         for 16*nv columns (one B micro-panel, kept in L1 across the row loop)
 *           for mr rows     -> microkernel -> epilogue (compensation, scales, store/add)
 *
 * Pure C: the ISA lives only in the function table, so the Arm build reuses it unchanged. */
#ifndef PYW8A8_SIMD_GEMM_LOOPS_H
#define PYW8A8_SIMD_GEMM_LOOPS_H

#include "common.h"

typedef struct {
    const w8_isa_ops *ops;
    int enc;                 /* W8_ENC_* of the packed weight */
    int64_t M, N, Kp;
    const uint8_t *a;        /* quantized activations, M rows of Kp bytes (stride lda) */
    int64_t lda;
    const int32_t *a_psum;   /* M x (Kp/64 + 1) prefix sums, for W8_CORR_ROW */
    const uint8_t *b;        /* packed weight panels */
    const int32_t *b_psum;   /* Np x (Kp/64 + 1) prefix sums, for W8_CORR_COL */
    const float *a_scale;    /* M, for W8_OUT_F32 */
    const float *b_scale;    /* N, for W8_OUT_F32 */
    int out_kind;            /* W8_OUT_* */
    void *out;               /* M x N, row stride ldo elements */
    int64_t ldo;
    int64_t kc, mc, nc;      /* blocking: kc multiple of 64, mc of mr, nc of 16 */
} w8_gemm_plan;

static void w8_epilogue(const w8_gemm_plan *g, const int32_t *tile, int64_t m, int rows,
                        int64_t n, int cols, int64_t k0, int64_t k1, int first)
{
    const int corr = g->ops->corr[g->enc];
    const int64_t np1 = g->Kp / W8_KPAD + 1, c0 = k0 / W8_KPAD, c1 = k1 / W8_KPAD;
    int32_t col_corr[W8_TILE_LD] = {0};
    if (corr == W8_CORR_COL)  /* b_psum is NULL for the other kernels */
        for (int c = 0; c < cols; c++) {
            const int32_t *ps = g->b_psum + (n + c) * np1;
            col_corr[c] = 128 * (ps[c1] - ps[c0]);
        }
    for (int r = 0; r < rows; r++) {
        const int32_t *t = tile + r * W8_TILE_LD;
        int32_t row_corr = 0;
        if (corr == W8_CORR_ROW) {
            const int32_t *ps = g->a_psum + (m + r) * np1;
            row_corr = 128 * (ps[c1] - ps[c0]);
        }
        if (g->out_kind == W8_OUT_F32) {
            float *o = (float *)g->out + (m + r) * g->ldo + n;
            const float sa = g->a_scale[m + r];
            const float *sb = g->b_scale + n;
            if (first)
                for (int c = 0; c < cols; c++)
                    o[c] = (float)(t[c] - row_corr - col_corr[c]) * (sa * sb[c]);
            else
                for (int c = 0; c < cols; c++)
                    o[c] += (float)(t[c] - row_corr - col_corr[c]) * (sa * sb[c]);
        } else if (g->out_kind == W8_OUT_I32) {
            int32_t *o = (int32_t *)g->out + (m + r) * g->ldo + n;
            for (int c = 0; c < cols; c++) o[c] = t[c] - row_corr - col_corr[c];
        } else {
            int64_t *o = (int64_t *)g->out + (m + r) * g->ldo + n;
            if (first)
                for (int c = 0; c < cols; c++) o[c] = t[c] - row_corr - col_corr[c];
            else
                for (int c = 0; c < cols; c++) o[c] += t[c] - row_corr - col_corr[c];
        }
    }
}

/* C[m0:m1, n0:n1] for one task; n0 is a multiple of 16 (a panel boundary). */
static void w8_gemm_range(const w8_gemm_plan *g, int64_t m0, int64_t m1, int64_t n0,
                          int64_t n1)
{
    const w8_isa_ops *ops = g->ops;
    const w8_ukernel_fn kernel = ops->ukernel[g->enc];
    const int64_t ps = g->Kp / 4 * W8_QUAD_BYTES; /* bytes of one panel */
    const int64_t ncols = (int64_t)W8_NR * ops->nv;
    W8_ALIGN(64) int32_t tile[W8_MAX_MR * W8_TILE_LD];
    for (int64_t nb = n0; nb < n1; nb += g->nc) {
        const int64_t nb1 = nb + g->nc < n1 ? nb + g->nc : n1;
        for (int64_t k0 = 0; k0 < g->Kp; k0 += g->kc) {
            const int64_t k1 = k0 + g->kc < g->Kp ? k0 + g->kc : g->Kp;
            for (int64_t mb = m0; mb < m1; mb += g->mc) {
                const int64_t mb1 = mb + g->mc < m1 ? mb + g->mc : m1;
                for (int64_t n = nb; n < nb1; n += ncols) {
                    const int cols = (int)(nb1 - n < ncols ? nb1 - n : ncols);
                    const int npanels = (cols + W8_NR - 1) / W8_NR;
                    const uint8_t *bp = g->b + (n / W8_NR) * ps + k0 / 4 * W8_QUAD_BYTES;
                    for (int64_t m = mb; m < mb1; m += ops->mr) {
                        const int rows = (int)(mb1 - m < ops->mr ? mb1 - m : ops->mr);
                        kernel(rows, npanels, (k1 - k0) / 4, g->a + m * g->lda + k0, g->lda,
                               bp, ps, tile);
                        w8_epilogue(g, tile, m, rows, n, cols, k0, k1, k0 == 0);
                    }
                }
            }
        }
    }
}

#endif
