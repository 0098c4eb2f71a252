/* The registry of ISAs (numpy-style run-time dispatch): every ISA is
 * compiled into the one binary with target attributes, and this table is the only place
 * that lists them.  Each entry holds the ISA's kernels, corrections, quantizer, prefix
 * sums, row expansion, FWHT, sign application, epilogue, activation pass, peak probe and
 * support predicate; the lookup by name, the support checks and the Python lists (_kernels.pyx)
 * all read the table. */
#ifndef PYW8A8_SIMD_DISPATCH_H
#define PYW8A8_SIMD_DISPATCH_H

#include "common.h"
#include "cpu.h"
#include "scalar.h"
#include "quant.h"
#include "gemm_loops.h"
#include "product.h"
#if defined(W8_X86)
#include "avx2.h"
#include "avxvnni.h"
#include "avx512vnni.h"
#include "amx.h"
#endif
#if defined(W8_ARM64)
#include "neon.h"
#endif

/* ---- support predicates ---- */

static int w8_scalar_supported(const w8_cpu_features *f)
{
    (void)f;
    return 1;
}

#if defined(W8_X86)
static int w8_avx2_supported(const w8_cpu_features *f) { return f->avx2 && f->fma; }

static int w8_avxvnni_supported(const w8_cpu_features *f)
{
    return w8_avx2_supported(f) && f->avxvnni;
}

static int w8_avx512_supported(const w8_cpu_features *f)
{
    return w8_avx2_supported(f) && f->avx512f && f->avx512bw && f->avx512vl &&
           f->avx512vnni;
}

#if defined(W8_HAVE_AMX)
/* Linux grants the tile state only on request; the answer holds for the whole process, so
 * it is asked once. */
static int w8_amx_granted(void)
{
    static int granted = -1;
    if (granted < 0) granted = w8_amx_request();
    return granted;
}

static int w8_amx_supported(const w8_cpu_features *f)
{
    return w8_avx512_supported(f) && f->amx_tile && f->amx_int8 && w8_amx_granted();
}
#endif
#endif

#if defined(W8_ARM64)
static int w8_neondot_supported(const w8_cpu_features *f) { return f->asimd && f->asimddp; }

static int w8_neon_supported(const w8_cpu_features *f) { return f->asimd; }
#endif

/* The passes an ISA takes from its vector vocabulary (vec_<v>.h and the templates on it):
 * the float epilogue and activations, the row quantizer, the FWHT and the rotation. */
#define W8_VOCABULARY_PASSES(v)                                                     \
    .epilogue = w8_##v##_epilogue, .act_tile = w8_##v##_act_tile,                   \
    .absmax = w8_##v##_absmax, .quantize = w8_##v##_quantize, .fwht = w8_##v##_fwht, \
    .rotate_absmax = w8_##v##_rotate_absmax

/* ---- the table, most preferred ISA first ---- */

/* The kernels of an ISA built from ukernel.h, each encoding's: plain, finishing tiles, and
 * both again prefetching the weight (the tuner's choice for one or two row tiles). */
#define W8_UKERNELS(p)                                                                   \
    .ukernel = {w8_##p##_ukernel_biased, w8_##p##_ukernel_signed},                       \
    .ukernel_f32 = {w8_##p##_ukernel_f32_biased, w8_##p##_ukernel_f32_signed},           \
    .ukernel_prefetch = {w8_##p##_ukernel_prefetch_biased, w8_##p##_ukernel_prefetch_signed}, \
    .ukernel_f32_prefetch = {w8_##p##_ukernel_f32_prefetch_biased,                       \
                             w8_##p##_ukernel_f32_prefetch_signed}

static const w8_isa_ops w8_isas[] = {
#if defined(W8_HAVE_AMX)
    {.name = "amx", .mr = W8_AMX_MR, .npanels = W8_AMX_NPANELS, .whole_tiles = 1,
     .whole_k = 1,
     .ukernel = {w8_amx_ukernel_biased, w8_amx_ukernel_signed},
     .ukernel_f32 = {w8_amx_ukernel_f32_biased, w8_amx_ukernel_f32_signed},
     .ukernel_prefetch = {w8_amx_ukernel_prefetch_biased, w8_amx_ukernel_prefetch_signed},
     .ukernel_f32_prefetch = {w8_amx_ukernel_f32_prefetch_biased,
                              w8_amx_ukernel_f32_prefetch_signed},
     .corr = {W8_CORR_ROW, W8_CORR_NONE}, .a_flip = {0, 0}, .auto_encoding = W8_ENC_BIASED,
     W8_VOCABULARY_PASSES(avx512),
     .prefix_sums = w8_avx2_prefix_sums, .sign_scale = w8_avx2_sign_scale,
     .task_begin = w8_amx_task_begin, .tile_rows = w8_amx_tile_rows,
     .task_end = w8_amx_task_end, .peak = w8_amx_peak, .supported = w8_amx_supported},
#endif
#if defined(W8_X86)
    {.name = "avx512vnni", .mr = W8_AVX512_MR, .npanels = W8_AVX512_NPANELS,
     W8_UKERNELS(avx512),
     .corr = {W8_CORR_ROW, W8_CORR_COL}, .a_flip = {0, 0x80},
     .auto_encoding = W8_ENC_BIASED, W8_VOCABULARY_PASSES(avx512),
     .prefix_sums = w8_avx2_prefix_sums, .sign_scale = w8_avx2_sign_scale,
     .peak = w8_avx512_peak, .supported = w8_avx512_supported},
    {.name = "avxvnni", .mr = W8_AVXVNNI_MR, .npanels = W8_AVXVNNI_NPANELS,
     W8_UKERNELS(avxvnni),
     .corr = {W8_CORR_ROW, W8_CORR_COL}, .a_flip = {0, 0x80},
     .auto_encoding = W8_ENC_BIASED, W8_VOCABULARY_PASSES(avx2),
     .prefix_sums = w8_avx2_prefix_sums, .sign_scale = w8_avx2_sign_scale,
     .peak = w8_avxvnni_peak, .supported = w8_avxvnni_supported},
    /* |a| by the weight flipped where a < 0, from rows expanded once per call: the
     * negatives' correction for either encoding (avx2.h). */
    {.name = "avx2", .mr = W8_AVX2_MR, .npanels = W8_AVX2_NPANELS,
     W8_UKERNELS(avx2),
     .corr = {W8_CORR_NEG, W8_CORR_NEG}, .a_flip = {0, 0x80},
     .auto_encoding = W8_ENC_BIASED, W8_VOCABULARY_PASSES(avx2),
     .prefix_sums = w8_avx2_negative_prefix_sums, .expand_row = w8_avx2_flip_expand_row,
     .sign_scale = w8_avx2_sign_scale, .peak = w8_avx2_peak, .supported = w8_avx2_supported},
#endif
#if defined(W8_ARM64)
    /* sdot is signed by signed: no compensation, and signed weights need no XOR. */
    {.name = "neondot", .mr = W8_NEON_MR, .npanels = W8_NEON_NPANELS,
     W8_UKERNELS(neondot),
     .corr = {W8_CORR_NONE, W8_CORR_NONE}, .a_flip = {0, 0},
     .auto_encoding = W8_ENC_SIGNED, W8_VOCABULARY_PASSES(neon),
     .prefix_sums = w8_prefix_sums, .sign_scale = w8_scalar_sign_scale, .peak = w8_scalar_peak,
     .supported = w8_neondot_supported},
    {.name = "neon", .mr = W8_NEON_MR, .npanels = W8_NEON_NPANELS,
     W8_UKERNELS(neon),
     .corr = {W8_CORR_NONE, W8_CORR_NONE}, .a_flip = {0, 0},
     .auto_encoding = W8_ENC_SIGNED, W8_VOCABULARY_PASSES(neon),
     .prefix_sums = w8_prefix_sums, .sign_scale = w8_scalar_sign_scale, .peak = w8_scalar_peak,
     .supported = w8_neon_supported},
#endif
    /* The portable reference every ISA must match bit for bit. */
    {.name = "scalar", .mr = W8_SCALAR_MR, .npanels = W8_SCALAR_NPANELS,
     .ukernel = {w8_scalar_ukernel_biased, w8_scalar_ukernel_signed},
     .corr = {W8_CORR_NONE, W8_CORR_NONE}, .a_flip = {0, 0},
#if defined(W8_ARM64)
     .auto_encoding = W8_ENC_SIGNED,
#else
     .auto_encoding = W8_ENC_BIASED,
#endif
     W8_VOCABULARY_PASSES(scalar),
     .prefix_sums = w8_prefix_sums, .sign_scale = w8_scalar_sign_scale, .peak = w8_scalar_peak,
     .supported = w8_scalar_supported},
    /* The u8 x s8 arithmetic of the VNNI/AMX ISAs in plain C, so their compensation is
     * tested on every CPU; as slow as scalar, hence never chosen unless asked for. */
    {.name = "scalar_u8s8", .mr = W8_SCALAR_MR, .npanels = W8_SCALAR_NPANELS,
     .ukernel = {w8_scalar_u8s8_ukernel_biased, w8_scalar_u8s8_ukernel_signed},
     .corr = {W8_CORR_ROW, W8_CORR_COL}, .a_flip = {0, 0x80},
     .auto_encoding = W8_ENC_BIASED, W8_VOCABULARY_PASSES(scalar),
     .prefix_sums = w8_prefix_sums, .sign_scale = w8_scalar_sign_scale, .peak = w8_scalar_peak,
     .supported = w8_scalar_supported, .explicit_only = 1},
};

#define W8_NUM_ISAS ((int)(sizeof(w8_isas) / sizeof(w8_isas[0])))

#if !defined(W8_HAVE_AMX)
/* No AMX ISA in this build: nothing to read back. */
static inline int w8_amx_config_roundtrip(void) { return -1; }
#endif

/* The entry named `name`, or NULL. */
static inline const w8_isa_ops *w8_isa_lookup(const char *name)
{
    for (int i = 0; i < W8_NUM_ISAS; i++)
        if (strcmp(w8_isas[i].name, name) == 0) return &w8_isas[i];
    return NULL;
}

/* The first (most preferred) ISA this CPU runs that is not explicit-only. */
static inline const w8_isa_ops *w8_isa_best(const w8_cpu_features *f)
{
    for (int i = 0; i < W8_NUM_ISAS; i++)
        if (!w8_isas[i].explicit_only && w8_isas[i].supported(f)) return &w8_isas[i];
    return NULL;
}

#endif
