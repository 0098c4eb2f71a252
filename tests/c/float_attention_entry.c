/* One build of the float attention (_simd/float_attention.h) for one vector width: run.sh
 * compiles it once per width, W8_ROW_CLONES set to that target and FA_ENTRY to a name of
 * its own, for test_float_attention.c to compare their bits. */
#include <stdlib.h>

#include "float_attention.h"

/* The whole call on one thread: the spans, then every task.  Returns 0, or -1 without
 * memory. */
int FA_ENTRY(const w8_float_attention *a)
{
    const int64_t heads = w8_fa_span_heads(a), rows = a->B * heads;
    float *scratch = malloc(sizeof(float) * (size_t)w8_fa_scratch_floats(a));
    w8_fa_span *spans = malloc(sizeof(w8_fa_span) * (size_t)(rows * a->Lq + 1));
    if (!scratch || !spans) {
        free(scratch);
        free(spans);
        return -1;
    }
    for (int64_t t = 0; t < rows; t++) w8_fa_spans(a, t / heads, t % heads, spans + t * a->Lq);
    for (int64_t t = 0; t < a->B * a->Hq; t++) w8_float_attention_task(a, t, spans, scratch);
    free(scratch);
    free(spans);
    return 0;
}
