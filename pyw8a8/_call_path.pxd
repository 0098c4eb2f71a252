# Declarations of the call object of every product (_simd/call.h, its implementation
# call_path.h, its faults faults.h), compiled into _kernels alone, which cimports them.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from pyw8a8._core cimport w8_isa_ops

cdef extern from "_simd/call_path.h" nogil:
    ctypedef struct w8_weight_header:
        int64_t format_version, n, k, encoding, rotate, block, seed
    ctypedef struct w8_weight_arrays:
        const uint8_t *panels
        int64_t panels_bytes
        const int32_t *psum
        int64_t psum_values
        const float *scales
        int64_t scales_values
    ctypedef struct w8_plan:
        const uint8_t *panels
        const int32_t *psum
        const float *scales
        const float *signs
        int64_t N, K, Kp, block
        int enc, rotate
        uint32_t seed
    enum:
        W8_FORMAT_UNPADDED, W8_FORMAT_PADDED, W8_MIN_BLOCK, W8_MAX_BLOCK
        W8_CALL_ONE, W8_CALL_PAIR, W8_CALL_GLU, W8_CALL_KINDS
        W8_SETTLED_SLOTS
        W8_PLAN_CHECK_CONTENTS, W8_PLAN_ALIGNED_COPY
        W8_CALL_ABI_VERSION
        W8_FAULT_NONE, W8_FAULT_ACTIVATION, W8_FAULT_NO_MEMORY, W8_FAULT_FEATURES
        W8_ARG_X, W8_ARG_W1, W8_ARG_W2, W8_ARG_B1, W8_ARG_B2, W8_ARG_COUNT
        W8_ERROR_VALUE, W8_ERROR_TYPE, W8_ERROR_MEMORY
        W8_TUNE_SETTLED, W8_TUNE_UNTIMED, W8_TUNE_ROUNDS, W8_MAX_CANDIDATES
    const char *W8_CALL_CAPSULE
    ctypedef struct w8_call:
        const void *x
        int int8_input
        int64_t M, K
        int kind
        const w8_plan *plan[2]
        const float *bias[2]
        int act
        void *out[2]
        int64_t ldo[2]
        int out_size
        const void *isa
        int nthreads
        const int64_t *blocking
    ctypedef struct w8_fault:
        int code
        int arg
        int64_t a, b, c
    ctypedef struct w8_fault_names:
        const char *name[5]
        int ndim
        const int64_t *shape
        const char *activation_arg
        const char *activation_given
    ctypedef struct w8_call_api:
        int abi_version
        void (*place)(int64_t rows, int64_t work, int torch_threads, const void **isa,
                      int *nthreads) noexcept nogil
        w8_plan *(*plan_new)(const w8_weight_header *h, const w8_weight_arrays *a,
                             int flags, w8_fault *fault) noexcept nogil
        void (*plan_free)(w8_plan *plan) noexcept nogil
        int64_t (*plan_outputs)(const w8_plan *plan) noexcept nogil
        int (*run)(const w8_call *call, w8_fault *fault) noexcept nogil
        int (*activation_code)(const char *name) noexcept nogil
        int (*fault_text)(const w8_fault *fault, const w8_fault_names *names, char *buf,
                          size_t n) noexcept nogil
        void *(*output_take)(size_t bytes, size_t *size) noexcept nogil
        void (*output_give)(void *memory, size_t size) noexcept nogil
    ctypedef struct w8_blocking:
        int64_t kc, mc, nc, m_step, n_step, prefetch
    ctypedef struct w8_isa_id:
        pass
    ctypedef struct w8_tune_entry:
        pass
    ctypedef struct w8_tuner:
        w8_tune_entry **entries
        int64_t count
    ctypedef struct w8_tune_choice:
        w8_tune_entry *entry
        int index
        w8_blocking blocking
    const char *w8_activation_names[]
    int w8_call_path_init()
    w8_plan *w8_plan_new(const w8_weight_header *h, const w8_weight_arrays *a, int flags,
                         w8_fault *f)
    void w8_plan_free(w8_plan *p)
    int64_t w8_plan_outputs(const w8_plan *p)
    int w8_call_run(const w8_call *c, w8_fault *f)
    int w8_activation_code(const char *name)
    int w8_fault_text(const w8_fault *f, const w8_fault_names *names, char *buf, size_t n)
    void w8_call_lock_take()
    void w8_call_lock_give()
    w8_isa_id w8_isa_id_of(const w8_isa_ops *ops)
    int w8_settled_blocking(const w8_plan *p, int kind, w8_isa_id isa, int64_t rows,
                            int nthreads, w8_blocking *b)
    int64_t w8_call_unsettled()
    void w8_call_forget_tuning()
    int w8_candidates(const w8_isa_ops *ops, int64_t m, int64_t n, int64_t kp, int nthreads,
                      int streams, w8_blocking *out)
    int64_t w8_kc_for(const w8_isa_ops *ops, int64_t kp, int streams, int64_t m)
    int64_t w8_m_bucket(int64_t m)
    int64_t w8_tuned_cache_bytes(int level)
    w8_blocking w8_fit_blocking(w8_blocking b, int64_t m)
    int w8_tune_choose(w8_tuner *t, const w8_isa_ops *ops, int enc, int group, int64_t m,
                       int64_t n, int64_t kp, int nthreads, int streams,
                       w8_tune_choice *choice)
    void w8_tune_record(w8_tune_entry *e, int index, double seconds)
    void w8_tune_clear(w8_tuner *t)
