/* The one table of what a call or a plan is refused for (call.h's W8_FAULT_*): each
 * fault's message and error class, read by numpy's API (pyw8a8._kernels raises them) and
 * by the torch operator (its TORCH_CHECKs), so both say the same thing. */
#ifndef PYW8A8_SIMD_FAULTS_H
#define PYW8A8_SIMD_FAULTS_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "call.h"
#include "common.h"

/* Sets fault f (its code, the argument it names, its values); returns its code. */
static inline int w8_fault_set(w8_fault *f, int code, int arg, int64_t a, int64_t b, int64_t c)
{
    f->code = code, f->arg = arg, f->a = a, f->b = b, f->c = c;
    return code;
}

/* The fused activations by name, W8_ACT_* order ("" is none). */
static const char *const w8_activation_names[] = {"", "relu", "gelu", "gelu_tanh", "silu"};
#define W8_ACTIVATION_NAMES "'relu', 'gelu', 'gelu_tanh', 'silu'"

/* The W8_ACT_* of a name (NULL or "": none), or -1. */
static int w8_activation_code(const char *name)
{
    if (name == NULL) return W8_ACT_NONE;
    for (int code = W8_ACT_NONE; code <= W8_ACT_SILU; code++)
        if (strcmp(name, w8_activation_names[code]) == 0) return code;
    return -1;
}

typedef struct {
    char *at;
    size_t left;
} w8_text;

static void w8_put(w8_text *t, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(t->at, t->left, format, args);
    va_end(args);
    if (n > 0) {
        const size_t used = (size_t)n < t->left ? (size_t)n : (t->left ? t->left - 1 : 0);
        t->at += used, t->left -= used;
    }
}

/* A shape as Python writes a tuple: (96,) or (2, 3, 96). */
static void w8_put_shape(w8_text *t, int ndim, const int64_t *shape)
{
    w8_put(t, "(");
    for (int i = 0; i < ndim; i++) w8_put(t, i ? ", %lld" : "%lld", (long long)shape[i]);
    w8_put(t, ndim == 1 ? ",)" : ")");
}

/* "row r", and its index over x's leading dimensions where there are several. */
static void w8_put_row(w8_text *t, int64_t row, const w8_fault_names *names)
{
    w8_put(t, "row %lld", (long long)row);
    if (names->shape == NULL || names->ndim <= 2) return;
    int64_t index[64], rest = row;
    for (int i = names->ndim - 2; i >= 0; i--) {
        index[i] = rest % names->shape[i];
        rest /= names->shape[i];
    }
    w8_put(t, " (index ");
    w8_put_shape(t, names->ndim - 1, index);
    w8_put(t, ")");
}

static void w8_put_rotation(w8_text *t, const int64_t *r)
{
    if (r[0]) w8_put(t, "(True, %lld, %lld)", (long long)r[1], (long long)r[2]);
    else w8_put(t, "(False,)");
}

static const char *const w8_array_names[] = {"panels", "psum", "scales"};

#define W8_STR_(x) #x
#define W8_STR(x) W8_STR_(x)
/* A setting's message (W8_SETTING_* order), of the value it was given. */
static const char *const w8_setting_texts[] = {
    "packed weight encoding %lld is not one of 0 (biased), 1 (signed)",
    "packed weight rotate must be 0 or 1, got %lld",
    "packed weight block must be a power of two from " W8_STR(W8_MIN_BLOCK) " to "
    W8_STR(W8_MAX_BLOCK) ", got %lld",
    "packed weight seed must be in [0, 2**32 - 1], got %lld",
    "packed weight shape has a negative size, %lld",
    "packed weight rotation: K=%lld is not a multiple of its block, which format 1 "
    "cannot hold",
};

/* A weight's fault (W8_FAULT_FORMAT to W8_FAULT_SCALES): its message. */
static void w8_put_weight_fault(w8_text *t, const w8_fault *f)
{
    switch (f->code) {
    case W8_FAULT_FORMAT:
        w8_put(t, "packed weight format %lld is not supported (this pyw8a8 reads %d, %d)",
               (long long)f->a, W8_FORMAT_UNPADDED, W8_FORMAT_PADDED);
        break;
    case W8_FAULT_SETTING:
        w8_put(t, w8_setting_texts[f->a >= 0 && f->a <= W8_SETTING_PARTIAL_BLOCK ? f->a : 0],
               (long long)f->b);
        break;
    case W8_FAULT_LAYOUT:
        w8_put(t, "packed weight array '%s' has %lld elements; its header implies %lld",
               w8_array_names[f->a >= 0 && f->a < 3 ? f->a : 0], (long long)f->b,
               (long long)f->c);
        break;
    case W8_FAULT_CONTENTS:
        if (f->a == 0) w8_put(t, "packed weight array 'panels' holds -128");
        else w8_put(t, "packed weight arrays 'panels'/'psum' are inconsistent (non-zero "
                       "padding or wrong compensation sums)");
        break;
    default:
        w8_put(t, "packed weight array 'scales' holds negative or non-finite values");
    }
}

/* A pair's fault (W8_FAULT_OTHER_*): its message. */
static void w8_put_pair_fault(w8_text *t, const w8_fault *f, const w8_fault_names *names)
{
    const char *w1 = names->name[W8_ARG_W1], *w2 = names->name[W8_ARG_W2];
    if (f->code == W8_FAULT_OTHER_K) {
        w8_put(t, "%s and %s differ in K: %lld vs %lld", w1, w2, (long long)f->a,
               (long long)f->b);
    } else if (f->code == W8_FAULT_OTHER_N) {
        w8_put(t, "%s=%s needs %s (the gate) and %s (the up projection) of one N: %lld vs "
                  "%lld", names->activation_arg, names->activation_given, w1, w2,
               (long long)f->a, (long long)f->b);
    } else {
        w8_put(t, "%s and %s use different rotations (rotate, block, seed): ", w1, w2);
        w8_put_rotation(t, f->rotation[0]);
        w8_put(t, " vs ");
        w8_put_rotation(t, f->rotation[1]);
    }
}

/* The message of fault f into buf (n bytes), naming the caller's arguments; returns its
 * error class (W8_ERROR_*). */
static int w8_fault_text(const w8_fault *f, const w8_fault_names *names, char *buf, size_t n)
{
    w8_text t = {buf, n};
    const char *arg = names->name[f->arg >= 0 && f->arg < W8_ARG_COUNT ? f->arg : 0];
    if (n) buf[0] = '\0';
    switch (f->code) {
    case W8_FAULT_FEATURES:
        w8_put(&t, "%s has %lld features in its last dimension (shape ", arg, (long long)f->a);
        if (names->shape) w8_put_shape(&t, names->ndim, names->shape);
        w8_put(&t, ") but the weight expects K=%lld", (long long)f->b);
        break;
    case W8_FAULT_ROW_NOT_FINITE:
        w8_put(&t, "%s has a non-finite value (NaN or Inf) in ", arg);
        w8_put_row(&t, f->a, names);
        w8_put(&t, "; int8 quantization needs finite values");
        break;
    case W8_FAULT_ROW_ROTATION:
        w8_put(&t, "%s row %lld is finite but too large to rotate: its rotation exceeds the "
                   "float32 range", arg, (long long)f->a);
        break;
    case W8_FAULT_BIAS_NOT_FINITE:
        w8_put(&t, "%s holds NaN or Inf", arg);
        break;
    case W8_FAULT_ACTIVATION:
        w8_put(&t, "%s must be None or one of " W8_ACTIVATION_NAMES ", got %s",
               names->activation_arg, names->activation_given);
        break;
    case W8_FAULT_NO_MEMORY:
        if (f->a > 0) w8_put(&t, "no memory for %lld bytes", (long long)f->a);
        else w8_put(&t, "out of memory");
        return W8_ERROR_MEMORY;
    default:
        if (f->code >= W8_FAULT_OTHER_K && f->code <= W8_FAULT_OTHER_ROTATION)
            w8_put_pair_fault(&t, f, names);
        else
            w8_put_weight_fault(&t, f);
    }
    return W8_ERROR_VALUE;
}

#endif
