/* The call object of every product, as its callers see it: numpy's API (pyw8a8._kernels)
 * and the PyTorch operator (pyw8a8/torch/csrc), which is built apart, against the
 * installed torch, and reaches the core through the table below (w8_call_api, published
 * by pyw8a8._kernels as the capsule W8_CALL_CAPSULE).  Plain C types only, so that a C++
 * extension built against any torch version includes this file and nothing else of the
 * core; a caller checks `abi_version` before anything else.
 *
 * A caller builds a plan once per packed weight (w8_plan_new: its header and arrays
 * checked), then runs calls on it (w8_call_run): the call path picks or tunes the
 * blocking, lays out the calling thread's scratch, quantizes the rows and runs the
 * kernels.  What a call refuses comes back as one w8_fault, whose message and error
 * class (w8_fault_text) are the same for every caller.  The implementation is
 * call_path.h. */
#ifndef PYW8A8_SIMD_CALL_H
#define PYW8A8_SIMD_CALL_H

#include <stddef.h>
#include <stdint.h>

#define W8_CALL_ABI_VERSION 2
#define W8_CALL_CAPSULE "pyw8a8._kernels.CALL_API"

/* A packed weight's settings, in the order of its saved header (pyw8a8.torch's
 * HEADER_FIELDS): format version, N, K, encoding (0 biased, 1 signed), rotate, block,
 * seed. */
typedef struct {
    int64_t format_version, n, k, encoding, rotate, block, seed;
} w8_weight_header;
#define W8_HEADER_FIELDS 7
/* The format versions read (2: a rotation's last block zero-padded), and the blocks a
 * rotation takes (powers of two). */
#define W8_FORMAT_UNPADDED 1
#define W8_FORMAT_PADDED 2
#define W8_MIN_BLOCK 16
#define W8_MAX_BLOCK 4096

/* A packed weight's arrays as the caller holds them: their memory and element counts
 * (the caller has checked their element types: uint8, int32, float32). */
typedef struct {
    const uint8_t *panels;
    int64_t panels_bytes;
    const int32_t *psum;
    int64_t psum_values;
    const float *scales;
    int64_t scales_values;
} w8_weight_arrays;

/* A weight's plan: its arrays as the kernels read them, its rotation's sign table and the
 * blockings its calls settled.  Opaque to callers. */
typedef struct w8_plan w8_plan;

/* How a plan is made: W8_PLAN_CHECK_CONTENTS checks the arrays' contents too (O(N K):
 * what pack_weight makes of int8 weights), W8_PLAN_ALIGNED_COPY reads panels that are not
 * on a 64-byte boundary from an aligned copy of its own (every kernel load of aligned
 * panels is one cache line). */
enum { W8_PLAN_CHECK_CONTENTS = 1, W8_PLAN_ALIGNED_COPY = 2 };

/* The kinds of call, each remembered apart by a plan: one product (matmul), a pair of one
 * activation (matmul_pair), a gated pair (matmul_pair with glu=, the torch GatedLinear). */
enum { W8_CALL_ONE = 0, W8_CALL_PAIR = 1, W8_CALL_GLU = 2, W8_CALL_KINDS = 3 };

/* One call: rows x (M x K, C order; float32, or int8 in [-127, 127] with int8_input)
 * times one or two plans of this K.  Output j: M rows of the plan's N values, `ldo[j]`
 * elements apart, float32 (4 bytes) for float rows, int32 or int64 (`out_size` 4 or 8)
 * for int8 rows; a gated pair writes out[0] only.  `isa` and `nthreads` come from the
 * process's settings (pyw8a8._dispatch: call_ops and threads_for, or `place` below).
 * `blocking` NULL: the plan's settled blocking, or the tuner's choice; else this
 * (kc, mc, nc, m_step, n_step, prefetch), untuned (the tests' K-ranges, attention's
 * pages). */
typedef struct {
    const void *x;
    int int8_input;
    int64_t M, K;
    int kind;                  /* W8_CALL_* */
    const w8_plan *plan[2];    /* plan[1]: a pair's second weight, else NULL */
    const float *bias[2];      /* NULL or N floats */
    int act;                   /* W8_ACT_* of the first product (a gated pair's gate) */
    void *out[2];
    int64_t ldo[2];
    int out_size;
    const void *isa;           /* a w8_isa_ops */
    int nthreads;
    const int64_t *blocking;
} w8_call;

/* Why a call or a plan is refused: `code` (W8_FAULT_*), `arg` the argument it names
 * (W8_ARG_*), and its values. */
enum {
    W8_FAULT_NONE = 0,
    W8_FAULT_FEATURES,        /* x has a features, the weight K = b */
    W8_FAULT_ROW_NOT_FINITE,  /* row a of x holds NaN or Inf */
    W8_FAULT_ROW_ROTATION,    /* row a of x is finite, its rotation overflows float32 */
    W8_FAULT_BIAS_NOT_FINITE, /* bias `arg` holds NaN or Inf */
    W8_FAULT_ACTIVATION,      /* the activation is not one of W8_ACT_*'s names */
    W8_FAULT_OTHER_K,         /* a pair's weights differ in K: a vs b */
    W8_FAULT_OTHER_N,         /* a gated pair's weights differ in N: a vs b */
    W8_FAULT_OTHER_ROTATION,  /* a pair's weights differ in rotation */
    W8_FAULT_FORMAT,          /* a weight's format version a is not one this reads */
    W8_FAULT_SETTING,         /* a weight's setting (W8_SETTING_* in a) is out of range: b */
    W8_FAULT_LAYOUT,          /* a weight's array (W8_ARRAY_* in a) has b elements, not c */
    W8_FAULT_CONTENTS,        /* a weight's panels hold -128 (a 0), or padding or sums (1) */
    W8_FAULT_SCALES,          /* a weight's scales hold negative or non-finite values */
    W8_FAULT_NO_MEMORY,       /* a bytes of memory (0: unknown) could not be had */
    W8_FAULT_COUNT
};
enum { W8_ARG_X = 0, W8_ARG_W1, W8_ARG_W2, W8_ARG_B1, W8_ARG_B2, W8_ARG_COUNT };
enum { W8_SETTING_ENCODING = 0, W8_SETTING_ROTATE, W8_SETTING_BLOCK, W8_SETTING_SEED,
       W8_SETTING_SHAPE, W8_SETTING_PARTIAL_BLOCK };
enum { W8_ARRAY_PANELS = 0, W8_ARRAY_PSUM, W8_ARRAY_SCALES };
/* The error class of a fault: Python's ValueError, TypeError or MemoryError, torch's
 * TORCH_CHECK_VALUE, TORCH_CHECK_TYPE or a plain TORCH_CHECK. */
enum { W8_ERROR_VALUE = 0, W8_ERROR_TYPE, W8_ERROR_MEMORY };

typedef struct {
    int code;
    int arg;
    int64_t a, b, c;
    int64_t rotation[2][3]; /* W8_FAULT_OTHER_ROTATION: each weight's (rotate, block, seed) */
} w8_fault;

/* The names a caller gives its arguments in messages (W8_ARG_* order), x's shape (its
 * leading dimensions name a failing row's index), and the activation's argument and the
 * value given for it (W8_FAULT_ACTIVATION, W8_FAULT_OTHER_N). */
typedef struct {
    const char *name[W8_ARG_COUNT];
    int ndim;
    const int64_t *shape;
    const char *activation_arg, *activation_given;
} w8_fault_names;

typedef struct {
    int abi_version;
    /* The ISA and thread count of a call of `rows` rows doing `work` multiply-adds, the
     * thread count following `torch_threads` unless pyw8a8.set_num_threads overrides it
     * (pyw8a8._dispatch.call_place). */
    void (*place)(int64_t rows, int64_t work, int torch_threads, const void **isa,
                  int *nthreads);
    /* A plan of this header and these arrays, checked (`flags`: W8_PLAN_*); NULL with
     * `fault` set where refused.  The arrays must outlive the plan (but for panels it
     * copied). */
    w8_plan *(*plan_new)(const w8_weight_header *h, const w8_weight_arrays *a, int flags,
                         w8_fault *fault);
    void (*plan_free)(w8_plan *plan);
    int64_t (*plan_outputs)(const w8_plan *plan);
    /* Runs `call`: W8_FAULT_NONE, or a fault (no output then written). */
    int (*run)(const w8_call *call, w8_fault *fault);
    /* The activation code of a name ("" or NULL: none), or -1. */
    int (*activation_code)(const char *name);
    /* The message of `fault` into buf (n bytes, NUL-terminated); returns its error class. */
    int (*fault_text)(const w8_fault *fault, const w8_fault_names *names, char *buf,
                      size_t n);
    /* Memory for a float output of `bytes` (64-byte aligned), and its size in *size, from
     * the outputs freed before where one of bytes to 2 bytes is kept; give it back with
     * output_give.  NULL where none could be had. */
    void *(*output_take)(size_t bytes, size_t *size);
    void (*output_give)(void *memory, size_t size);
} w8_call_api;

#endif
