/* CPU feature detection and the AMX permission request.
 *
 * A feature counts only when both the CPU reports it (CPUID) and the operating system saves
 * its register state (XGETBV): an AVX-512 CPU under an OS that does not enable the zmm state
 * would fault on the first zmm instruction. */
#ifndef PYW8A8_SIMD_CPU_H
#define PYW8A8_SIMD_CPU_H

#include "common.h"

typedef struct w8_cpu_features_s {
    int sse41, avx2, fma, avx512f, avx512bw, avx512vl, avx512vnni, avxvnni,
        amx_tile, amx_int8, asimd, asimddp;
} w8_cpu_features;

#if defined(W8_X86)
#if defined(__GNUC__) || defined(__clang__)
#include <cpuid.h>
static void w8_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static uint64_t w8_xgetbv(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#else
#include <intrin.h>
static void w8_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    __cpuidex((int *)r, (int)leaf, (int)sub);
}
static uint64_t w8_xgetbv(void) { return _xgetbv(0); }
#endif

static inline void w8_cpu_detect(w8_cpu_features *f)
{
    uint32_t r[4], max_leaf;
    memset(f, 0, sizeof(*f));
    w8_cpuid(0, 0, r);
    max_leaf = r[0];
    if (max_leaf < 1) return;
    w8_cpuid(1, 0, r);
    f->sse41 = (r[2] >> 19) & 1;
    int fma = (r[2] >> 12) & 1, osxsave = (r[2] >> 27) & 1, avx = (r[2] >> 28) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = w8_xgetbv();
    int ymm_ok = (xcr0 & 0x6) == 0x6;            /* XMM and YMM state */
    int zmm_ok = ymm_ok && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    int amx_ok = (xcr0 & 0x60000) == 0x60000;     /* XTILECFG and XTILEDATA */
    if (!ymm_ok || max_leaf < 7) return;
    w8_cpuid(7, 0, r);
    uint32_t ebx = r[1], ecx = r[2], edx = r[3];
    f->fma = fma;
    f->avx2 = (ebx >> 5) & 1;
    if (zmm_ok) {
        f->avx512f = (ebx >> 16) & 1;
        f->avx512bw = (ebx >> 30) & 1;
        f->avx512vl = (ebx >> 31) & 1;
        f->avx512vnni = (ecx >> 11) & 1;
    }
    if (amx_ok) {
        f->amx_tile = (edx >> 24) & 1;
        f->amx_int8 = (edx >> 25) & 1;
    }
    w8_cpuid(7, 1, r);
    f->avxvnni = (r[0] >> 4) & 1;
}

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
/* Linux keeps the AMX tile data state off until a process asks for it; a tile instruction
 * before this request is a SIGILL.  Returns 1 when the tile state is granted. */
static inline int w8_amx_request(void)
{
    const long ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023;
    const long XFEATURE_XTILEDATA = 18;
    unsigned long bitmask = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bitmask) != 0) return 0;
    return (bitmask >> XFEATURE_XTILEDATA) & 1;
}
#else
static inline int w8_amx_request(void) { return 0; }
#endif

#elif defined(W8_ARM64) && defined(__linux__)
#include <sys/auxv.h>
static inline void w8_cpu_detect(w8_cpu_features *f)
{
    memset(f, 0, sizeof(*f));
    unsigned long hw = getauxval(AT_HWCAP);
    f->asimd = (hw >> 1) & 1;      /* HWCAP_ASIMD */
    f->asimddp = (hw >> 20) & 1;   /* HWCAP_ASIMDDP: sdot/udot */
}
static inline int w8_amx_request(void) { return 0; }
#else
static inline void w8_cpu_detect(w8_cpu_features *f) { memset(f, 0, sizeof(*f)); }
static inline int w8_amx_request(void) { return 0; }
#endif

#if defined(__linux__)
#include <unistd.h>
#endif

/* The per-core level-1 data (level 1) or level-2 (level 2) cache of this CPU in bytes, as
 * the C library reports it (glibc reads CPUID leaf 4, or 0x8000001D on AMD), or 0 where it
 * cannot tell; the blocking (tuning.py) sizes its K-ranges and blocks from them. */
static inline int64_t w8_cache_bytes(int level)
{
#if defined(__linux__) && defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
    const long bytes = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : _SC_LEVEL2_CACHE_SIZE);
    return bytes > 0 ? (int64_t)bytes : 0;
#else
    (void)level;
    return 0;
#endif
}

#endif
