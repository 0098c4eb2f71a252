# Declarations of the C core (pyw8a8/_simd) for the compiled modules. The constants that
# Python reads are declared once, in _kernels.pxd (cpdef enum), and cimported from there.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "_simd/dispatch.h" nogil:
    enum:
        W8_CORR_NONE, W8_CORR_ROW, W8_CORR_COL, W8_CORR_NEG
    bint W8_CORR_READS_ROWS(int corr)

    enum:
        W8_MAX_WEIGHTS  # the weights of one product call
        W8_NUM_ENCODINGS

    ctypedef struct w8_cpu_features:
        int sse41, avx2, fma, avx512f, avx512bw, avx512vl, avx512vnni, avxvnni
        int amx_tile, amx_int8, asimd, asimddp

    ctypedef void (*w8_ukernel_fn)(int rows, int npanels, int64_t kq, const uint8_t *a,
                                   int64_t lda, const uint8_t *b, int64_t panel_stride,
                                   int32_t *c, int64_t ldc, int accumulate)
    ctypedef struct w8_scaling:
        const int32_t *row_corr
        const int32_t *col_corr
        const float *a_scale
        const float *b_scale
        const float *bias
    ctypedef struct w8_tile_finish:
        w8_scaling g
        int act
        const int32_t *up
        int64_t ld_up
        w8_scaling u
    ctypedef void (*w8_act_tile_fn)(float *out, int64_t ldo, int rows, int cols,
                                    const w8_tile_finish *fin)
    ctypedef void (*w8_ukernel_f32_fn)(int rows, int npanels, int64_t kq, const uint8_t *a,
                                       int64_t lda, const uint8_t *b, int64_t panel_stride,
                                       int32_t *c, int64_t ldc, int accumulate,
                                       const w8_tile_finish *fin)
    ctypedef void (*w8_fwht_fn)(float *x, int64_t n)
    ctypedef void (*w8_sign_scale_fn)(const float *x, float *y, int64_t n, uint32_t pos,
                                      uint32_t seed, float c)
    ctypedef int64_t (*w8_peak_fn)(int64_t iters, int32_t *sink)

    ctypedef struct w8_isa_ops:
        const char *name
        int mr
        int npanels
        int whole_tiles
        int whole_k
        w8_ukernel_fn ukernel[W8_NUM_ENCODINGS]
        w8_ukernel_f32_fn ukernel_f32[W8_NUM_ENCODINGS]
        w8_ukernel_fn ukernel_prefetch[W8_NUM_ENCODINGS]
        w8_ukernel_f32_fn ukernel_f32_prefetch[W8_NUM_ENCODINGS]
        int corr[W8_NUM_ENCODINGS]
        uint8_t a_flip[W8_NUM_ENCODINGS]
        int auto_encoding
        w8_act_tile_fn act_tile
        w8_fwht_fn fwht
        w8_sign_scale_fn sign_scale
        w8_peak_fn peak
        int (*supported)(const w8_cpu_features *f)
        int explicit_only
    int W8_A_BYTES(const w8_isa_ops *ops)

    ctypedef struct w8_gemm:
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
        const float *bias
        int act
        const void *up  # a w8_gemm (a struct cannot name itself here)
        int out_kind
        void *out
        int64_t ldo
        int64_t kc, mc, nc

    ctypedef struct w8_gemm_job:
        w8_gemm g
        int64_t m_step, n_step
        int64_t first_task

    const w8_isa_ops w8_isas[]
    int W8_NUM_ISAS
    const w8_isa_ops *w8_isa_lookup(const char *name)
    const w8_isa_ops *w8_isa_best(const w8_cpu_features *f)
    void w8_cpu_detect(w8_cpu_features *f)
    int64_t w8_cache_bytes(int level)
    int w8_quantize_row(const w8_isa_ops *ops, const float *x, int64_t K, int64_t Kp,
                        uint8_t flip, uint8_t *q, float *scale, int32_t *psum)
    int w8_quantize_row_rotated(const w8_isa_ops *ops, const float *x, int64_t K,
                                int64_t Kp, uint8_t flip, uint8_t *q, float *scale,
                                int32_t *psum, int64_t block, const float *signs,
                                float *scratch)

    # The call path of every product (product.h).
    ctypedef struct w8_row_format:
        uint8_t flip
        int row_sums
        uint8_t *q
        int32_t *psum
    ctypedef struct w8_product:
        const w8_isa_ops *ops
        const void *x
        int int8_input
        int64_t M, K, Kp, block
        const float *signs
        w8_row_format fmt[W8_MAX_WEIGHTS]
        int nformats
        float *a_scale
        uint8_t *status
        float *rot
        int64_t rot_stride
        w8_gemm_job jobs[W8_MAX_WEIGHTS]
        int njobs
        w8_gemm up
        float *wide_out[2]
        int64_t wide_ldo[W8_MAX_WEIGHTS]
    int64_t w8_run_product(w8_product *p, int nthreads)
    int w8_amx_config_roundtrip()
    # The rotation (fwht.h): the sign hash and the row transforms.
    uint32_t w8_sign_bit(uint32_t pos, uint32_t seed)
    void w8_scalar_sign_scale(const float *x, float *y, int64_t n, uint32_t pos,
                              uint32_t seed, float c)
    void w8_sign_table(w8_sign_scale_fn sign_scale, float *s, int64_t K, int64_t block,
                       uint32_t seed)
    void w8_rotate_row(w8_fwht_fn fwht, w8_sign_scale_fn sign_scale, const float *x,
                       float *y, int64_t K, int64_t block, uint32_t seed)
    void w8_unrotate_row(w8_fwht_fn fwht, w8_sign_scale_fn sign_scale, const float *y,
                         float *x, int64_t K, int64_t block, uint32_t seed)
    void w8_task_begin(const w8_isa_ops *ops)
    void w8_task_end(const w8_isa_ops *ops)

cdef extern from "_simd/team.h" nogil:
    ctypedef struct w8_master_place:
        int cpu
    w8_master_place w8_master_here()
    int w8_leave_master_cpu(w8_master_place master)
    void w8_join_team(w8_master_place master)

cdef extern from "_simd/microbench.h" nogil:
    w8_peak_fn w8_fp32_peak(int zmm)
    uint64_t w8_read_bytes(const uint8_t *p, int64_t n)
    void w8_noop_ukernel_f32(int rows, int npanels, int64_t kq, const uint8_t *a,
                             int64_t lda, const uint8_t *b, int64_t panel_stride, int32_t *c,
                             int64_t ldc, int accumulate, const w8_tile_finish *fin)
    void w8_noop_ukernel(int rows, int npanels, int64_t kq, const uint8_t *a, int64_t lda,
                         const uint8_t *b, int64_t panel_stride, int32_t *c, int64_t ldc,
                         int accumulate)

