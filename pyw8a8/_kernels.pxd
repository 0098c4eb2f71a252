# Declarations of the C core (pyw8a8/_simd) used by the compiled module.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "_simd/dispatch.h" nogil:
    int W8_NR
    int W8_KPAD
    int W8_MAX_KC
    int W8_CORR_NONE, W8_CORR_ROW, W8_CORR_COL
    int W8_OUT_F32, W8_OUT_I32, W8_OUT_I64
    int W8_ENC_BIASED, W8_ENC_SIGNED

    ctypedef struct w8_isa_ops:
        const char *name
        int mr
        int nv
        int corr[2]
        uint8_t a_flip[2]

    ctypedef struct w8_cpu_features:
        int sse41, avx2, fma, avx512f, avx512bw, avx512vl, avx512vnni, avxvnni
        int amx_tile, amx_int8, asimd, asimddp

    ctypedef struct w8_gemm_plan:
        const w8_isa_ops *ops
        int enc
        int64_t M, N, Kp
        const uint8_t *a
        int64_t lda
        const int32_t *a_psum
        const uint8_t *b
        const int32_t *b_psum
        const float *a_scale
        const float *b_scale
        int out_kind
        void *out
        int64_t ldo
        int64_t kc, mc, nc

    const char *w8_isa_names[]
    int W8_NUM_ISAS
    const w8_isa_ops *w8_isa_lookup(const char *name)
    int w8_isa_supported(const w8_cpu_features *f, const char *name)
    void w8_cpu_detect(w8_cpu_features *f)
    int w8_amx_request()
    int w8_quantize_row(const w8_isa_ops *ops, const float *x, int64_t K, int64_t Kp,
                        uint8_t flip, uint8_t *q, float *scale, int32_t *psum)
    void w8_gemm_range(const w8_gemm_plan *g, int64_t m0, int64_t m1, int64_t n0,
                       int64_t n1)
    ctypedef void (*w8_fwht_fn)(float *x, int64_t n)
    w8_fwht_fn w8_fwht_for(const char *isa_name)
    int w8_quantize_row_rotated(const w8_isa_ops *ops, w8_fwht_fn fwht, const float *x,
                                int64_t K, int64_t Kp, uint8_t flip, uint8_t *q,
                                float *scale, int32_t *psum, int64_t block, uint32_t seed,
                                float *scratch)

cdef extern from "_simd/microbench.h" nogil:
    ctypedef int64_t (*w8_peak_fn)(int64_t iters, int32_t *sink)
    w8_peak_fn w8_peak_for(const char *isa)
    uint64_t w8_read_bytes(const uint8_t *p, int64_t n)
