/* Run-time choice of the instruction-set path (numpy-style dispatch): every path is compiled
 * into the one binary with target attributes; this picks a table by name and tells which
 * names this CPU can run. */
#ifndef PYW8A8_SIMD_DISPATCH_H
#define PYW8A8_SIMD_DISPATCH_H

#include "common.h"
#include "cpu.h"
#include "scalar.h"
#include "quant.h"
#include "gemm_loops.h"
#if defined(W8_X86)
#include "avx2.h"
#include "avxvnni.h"
#include "avx512vnni.h"
#include "amx.h"
#endif
#if defined(W8_ARM64)
#include "neon.h"
#endif

/* Paths from most to least preferred. */
#if defined(W8_ARM64)
static const char *const w8_isa_names[] = {"neondot", "neon", "scalar", "scalar_u8s8"};
#define W8_NUM_ISAS 4
#else
static const char *const w8_isa_names[] = {"amx", "avx512vnni", "avxvnni", "avx2", "scalar",
                                           "scalar_u8s8"};
#define W8_NUM_ISAS 6
#endif

static const w8_isa_ops *w8_isa_lookup(const char *name)
{
    if (strcmp(name, "scalar") == 0) return &w8_scalar_ops;
    if (strcmp(name, "scalar_u8s8") == 0) return &w8_scalar_u8s8_ops;
#if defined(W8_X86)
    if (strcmp(name, "avx2") == 0) return &w8_avx2_ops;
    if (strcmp(name, "avxvnni") == 0) return &w8_avxvnni_ops;
    if (strcmp(name, "avx512vnni") == 0) return &w8_avx512vnni_ops;
#endif
#if defined(W8_ARM64)
    if (strcmp(name, "neondot") == 0) return &w8_neondot_ops;
    if (strcmp(name, "neon") == 0) return &w8_neon_ops;
#endif
    return NULL;
}

/* Asks Linux for the tile state once; the answer holds for the whole process. */
static int w8_amx_granted(void)
{
    static int granted = -1;
    if (granted < 0) granted = w8_amx_request();
    return granted;
}

static int w8_isa_supported(const w8_cpu_features *f, const char *name)
{
    if (strcmp(name, "scalar") == 0 || strcmp(name, "scalar_u8s8") == 0) return 1;
    if (!w8_isa_lookup(name)) return 0;
    if (strcmp(name, "avx2") == 0) return f->avx2 && f->fma;
    if (strcmp(name, "avxvnni") == 0) return f->avx2 && f->fma && f->avxvnni;
    if (strcmp(name, "avx512vnni") == 0)
        return f->avx2 && f->fma && f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni;
    if (strcmp(name, "neondot") == 0) return f->asimd && f->asimddp;
    if (strcmp(name, "neon") == 0) return f->asimd;
    return 0;
}

#endif
