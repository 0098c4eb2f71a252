/* The registry of instruction-set paths (numpy-style run-time dispatch): every path is
 * compiled into the one binary with target attributes, and this table is the only place
 * that lists them.  Each entry holds the path's kernels, corrections, quantizer, FWHT, sign
 * application, epilogue, peak probe and support predicate; the lookup by name, the support
 * checks and the Python lists (_kernels.pyx) all read the table. */
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

static int w8_always(const w8_cpu_features *f)
{
    (void)f;
    return 1;
}

#if defined(W8_X86)
static int w8_has_avx2(const w8_cpu_features *f) { return f->avx2 && f->fma; }

static int w8_has_avxvnni(const w8_cpu_features *f) { return w8_has_avx2(f) && f->avxvnni; }

static int w8_has_avx512vnni(const w8_cpu_features *f)
{
    return w8_has_avx2(f) && f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni;
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

static int w8_has_amx(const w8_cpu_features *f)
{
    return w8_has_avx512vnni(f) && f->amx_tile && f->amx_int8 && w8_amx_granted();
}
#endif
#endif

#if defined(W8_ARM64)
static int w8_has_neondot(const w8_cpu_features *f) { return f->asimd && f->asimddp; }

static int w8_has_neon(const w8_cpu_features *f) { return f->asimd; }
#endif

/* ---- the table, most preferred path first ---- */

static const w8_isa_ops w8_isas[] = {
#if defined(W8_HAVE_AMX)
    {.name = "amx", .mr = W8_AMX_MR, .nv = W8_AMX_NV, .whole_tiles = 1, .whole_k = 1,
     .ukernel = {w8_amx_ukernel_biased, w8_amx_ukernel_signed},
     .corr = {W8_CORR_ROW, W8_CORR_NONE}, .a_flip = {0, 0}, .auto_encoding = W8_ENC_BIASED,
     .epilogue = w8_avx512_epilogue, .absmax = w8_avx512_absmax,
     .quantize = w8_avx512_quantize, .fwht = w8_fwht_avx512,
     .sign_scale = w8_sign_scale_avx2, .task_begin = w8_amx_task_begin,
     .task_end = w8_amx_task_end, .peak = w8_amx_peak, .supported = w8_has_amx},
#endif
#if defined(W8_X86)
    {.name = "avx512vnni", .mr = W8_AVX512_MR, .nv = W8_AVX512_NV,
     .ukernel = {w8_avx512_ukernel_biased, w8_avx512_ukernel_signed},
     .ukernel_f32 = {w8_avx512_ukernel_f32_biased, w8_avx512_ukernel_f32_signed},
     .corr = {W8_CORR_ROW, W8_CORR_COL}, .a_flip = {0, 0x80},
     .auto_encoding = W8_ENC_BIASED, .epilogue = w8_avx512_epilogue,
     .absmax = w8_avx512_absmax, .quantize = w8_avx512_quantize, .fwht = w8_fwht_avx512,
     .sign_scale = w8_sign_scale_avx2, .peak = w8_avx512_peak,
     .supported = w8_has_avx512vnni},
    {.name = "avxvnni", .mr = W8_AVXVNNI_MR, .nv = W8_AVXVNNI_NV,
     .ukernel = {w8_avxvnni_ukernel_biased, w8_avxvnni_ukernel_signed},
     .ukernel_f32 = {w8_avxvnni_ukernel_f32_biased, w8_avxvnni_ukernel_f32_signed},
     .corr = {W8_CORR_ROW, W8_CORR_COL}, .a_flip = {0, 0x80},
     .auto_encoding = W8_ENC_BIASED, .epilogue = w8_avx2_epilogue,
     .absmax = w8_avx2_absmax, .quantize = w8_avx2_quantize, .fwht = w8_fwht_avx2,
     .sign_scale = w8_sign_scale_avx2, .peak = w8_avxvnni_peak,
     .supported = w8_has_avxvnni},
    /* Signed by signed through the sign trick: no compensation for either encoding. */
    {.name = "avx2", .mr = W8_AVX2_MR, .nv = W8_AVX2_NV,
     .ukernel = {w8_avx2_ukernel_biased, w8_avx2_ukernel_signed},
     .ukernel_f32 = {w8_avx2_ukernel_f32_biased, w8_avx2_ukernel_f32_signed},
     .corr = {W8_CORR_NONE, W8_CORR_NONE}, .a_flip = {0, 0},
     .auto_encoding = W8_ENC_BIASED, .epilogue = w8_avx2_epilogue,
     .absmax = w8_avx2_absmax, .quantize = w8_avx2_quantize, .fwht = w8_fwht_avx2,
     .sign_scale = w8_sign_scale_avx2, .peak = w8_avx2_peak, .supported = w8_has_avx2},
#endif
#if defined(W8_ARM64)
    /* sdot is signed by signed: no compensation, and signed weights need no XOR. */
    {.name = "neondot", .mr = W8_NEON_MR, .nv = W8_NEON_NV,
     .ukernel = {w8_neondot_ukernel_biased, w8_neondot_ukernel_signed},
     .ukernel_f32 = {w8_neondot_ukernel_f32_biased, w8_neondot_ukernel_f32_signed},
     .corr = {W8_CORR_NONE, W8_CORR_NONE}, .a_flip = {0, 0},
     .auto_encoding = W8_ENC_SIGNED, .epilogue = w8_scalar_epilogue,
     .absmax = w8_neon_absmax, .quantize = w8_neon_quantize, .fwht = w8_fwht_neon,
     .sign_scale = w8_sign_scale_scalar, .peak = w8_scalar_peak,
     .supported = w8_has_neondot},
    {.name = "neon", .mr = W8_NEON_MR, .nv = W8_NEON_NV,
     .ukernel = {w8_neon_ukernel_biased, w8_neon_ukernel_signed},
     .ukernel_f32 = {w8_neon_ukernel_f32_biased, w8_neon_ukernel_f32_signed},
     .corr = {W8_CORR_NONE, W8_CORR_NONE}, .a_flip = {0, 0},
     .auto_encoding = W8_ENC_SIGNED, .epilogue = w8_scalar_epilogue,
     .absmax = w8_neon_absmax, .quantize = w8_neon_quantize, .fwht = w8_fwht_neon,
     .sign_scale = w8_sign_scale_scalar, .peak = w8_scalar_peak, .supported = w8_has_neon},
#endif
    /* The portable reference every path must match bit for bit. */
    {.name = "scalar", .mr = W8_SCALAR_MR, .nv = W8_SCALAR_NV,
     .ukernel = {w8_scalar_ukernel_biased, w8_scalar_ukernel_signed},
     .corr = {W8_CORR_NONE, W8_CORR_NONE}, .a_flip = {0, 0},
#if defined(W8_ARM64)
     .auto_encoding = W8_ENC_SIGNED,
#else
     .auto_encoding = W8_ENC_BIASED,
#endif
     .epilogue = w8_scalar_epilogue, .absmax = w8_scalar_absmax,
     .quantize = w8_scalar_quantize, .fwht = w8_fwht_scalar,
     .sign_scale = w8_sign_scale_scalar, .peak = w8_scalar_peak, .supported = w8_always},
    /* The u8 x s8 arithmetic of the VNNI/AMX paths in plain C, so their compensation is
     * tested on every CPU; as slow as scalar, hence never chosen unless asked for. */
    {.name = "scalar_u8s8", .mr = W8_SCALAR_MR, .nv = W8_SCALAR_NV,
     .ukernel = {w8_u8s8_ukernel_biased, w8_u8s8_ukernel_signed},
     .corr = {W8_CORR_ROW, W8_CORR_COL}, .a_flip = {0, 0x80},
     .auto_encoding = W8_ENC_BIASED, .epilogue = w8_scalar_epilogue,
     .absmax = w8_scalar_absmax, .quantize = w8_scalar_quantize, .fwht = w8_fwht_scalar,
     .sign_scale = w8_sign_scale_scalar, .peak = w8_scalar_peak, .supported = w8_always,
     .explicit_only = 1},
};

#define W8_NUM_ISAS ((int)(sizeof(w8_isas) / sizeof(w8_isas[0])))

#if !defined(W8_HAVE_AMX)
/* No AMX path in this build: nothing to read back. */
static inline int w8_amx_config_roundtrip(void) { return -1; }
#endif

/* The entry named `name`, or NULL. */
static inline const w8_isa_ops *w8_isa_lookup(const char *name)
{
    for (int i = 0; i < W8_NUM_ISAS; i++)
        if (strcmp(w8_isas[i].name, name) == 0) return &w8_isas[i];
    return NULL;
}

/* The first (most preferred) path this CPU runs that is not explicit-only. */
static inline const w8_isa_ops *w8_isa_best(const w8_cpu_features *f)
{
    for (int i = 0; i < W8_NUM_ISAS; i++)
        if (!w8_isas[i].explicit_only && w8_isas[i].supported(f)) return &w8_isas[i];
    return NULL;
}

#endif
