/* The C interface the compiled core offers to code built apart from it, the PyTorch
 * operator of pyw8a8.torch above all: a table of plain C functions that
 * pyw8a8._kernels publishes as a capsule (NATIVE_API), so that an extension built
 * against any torch version reaches the product without Python, numpy or the core's
 * own headers.  Only this file is shared: its structs hold C types alone, and a caller
 * checks `abi_version` before anything else. */
#ifndef PYW8A8_SIMD_NATIVE_API_H
#define PYW8A8_SIMD_NATIVE_API_H

#include <stddef.h>
#include <stdint.h>

#define W8_NATIVE_ABI_VERSION 1
#define W8_NATIVE_CAPSULE "pyw8a8._kernels.NATIVE_API"

/* One packed weight as the kernels read it (a WeightPlan's C half).  The pointers are
 * the packed arrays' memory; `signs` the rotation's sign table (K floats) or NULL. */
typedef struct {
    const uint8_t *panels;
    const int32_t *psum; /* NULL where the encoding needs no sums */
    const float *scales;
    const float *signs;
    int64_t N, K, Kp, block;
    int enc, rotate;
    uint32_t seed;
} w8_weight_desc;

/* A blocking of one product: (kc, mc, nc, m_step, n_step), as the tuner settles it. */
typedef struct {
    int64_t kc, mc, nc, m_step, n_step;
} w8_blocking;

/* A float32 product of M rows: act(x @ w0.T + bias0), or with glu (two weights of one N)
 * act(x @ w0.T + bias0) * (x @ w1.T + bias1); one output of M x N float32, C order. */
typedef struct {
    const float *x; /* M x K, C order */
    int64_t M, K;
    const w8_weight_desc *w[2];
    const float *bias[2]; /* NULL or N floats */
    int nw;               /* 1, or 2 with glu */
    int glu;
    int act;              /* W8_ACT_* */
    w8_blocking blocking;
    float *out;           /* M x N */
} w8_native_call;

/* Where a call runs: the ISA (an opaque handle that a settled blocking is remembered
 * with) and the thread count, from the process's settings, as pyw8a8.matmul's call
 * setup decides them; `generation` changes whenever those settings change. */
typedef struct {
    const void *isa;
    int nthreads;
    uint64_t generation;
} w8_call_place;

typedef struct {
    int abi_version;
    /* The place of a call of `rows` rows and `work` multiply-adds, the thread count
     * following `torch_threads` unless pyw8a8.set_num_threads overrides it; 0, or -1
     * where the call must take the Python route (a use_isa scope is open somewhere). */
    int (*call_place)(int64_t rows, int64_t work, int torch_threads, w8_call_place *place);
    /* Bytes of scratch a call needs on `place`. */
    size_t (*scratch_bytes)(const w8_native_call *call, const w8_call_place *place);
    /* Runs the call on `place` with `scratch` (64-byte aligned, scratch_bytes of it):
     * -1 when done, or the index of the first row that holds NaN/Inf or whose rotation
     * overflows (the output is then left untouched). */
    int64_t (*run)(const w8_native_call *call, const w8_call_place *place, void *scratch);
    /* The activation code of a name ("" for none), or -1. */
    int (*activation_code)(const char *name);
} w8_native_api;

#endif
