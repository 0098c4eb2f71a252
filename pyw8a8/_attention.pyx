# cython: language_level=3
"""Attention over rows: float attention (``_simd/float_attention.h``, an encoder's under
pyw8a8.torch) and int8 attention over a paged int8 KV store (``_simd/kv_attention.h``,
pyw8a8.attention's and pyw8a8.torch.Int8Cache's), whose int8 products run a page at a
time on the call path of ``_kernels``, reached through its table (``CALL_API``).

Callers validate their arrays' dtypes and layouts; the C checks what would write out of
bounds.  Loops release the GIL.
"""
from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset
from cpython.pycapsule cimport PyCapsule_GetPointer
cimport numpy as cnp

import numpy as np

from pyw8a8 import _kernels

cnp.import_array()

cdef extern from "_simd/team.h" nogil:
    ctypedef struct w8_master_place:
        int cpu
    w8_master_place w8_master_here()
    void w8_join_team(w8_master_place master)

cdef extern from "_simd/float_attention.h" nogil:
    ctypedef struct w8_float_attention:
        const float *q
        const float *k
        const float *v
        int64_t qs[3]
        int64_t ks[3]
        int64_t vs[3]
        float *out
        int64_t os[3]
        const uint8_t *mask_bool
        const float *mask_add
        int64_t ms[3]
        int causal
        int64_t B, Hq, Hkv, Lq, Lk, D
        float scale
    ctypedef struct w8_fa_span:
        int64_t lo, hi, holes
    int64_t w8_fa_scratch_floats(const w8_float_attention *a)
    int64_t w8_fa_span_heads(const w8_float_attention *a)
    void w8_fa_spans(const w8_float_attention *a, int64_t b, int64_t h, w8_fa_span *span)
    void w8_float_attention_task(const w8_float_attention *a, int64_t t,
                                 const w8_fa_span *spans, float *scratch)

cdef extern from "_simd/kv_attention.h" nogil:
    ctypedef struct w8_plan:
        pass
    ctypedef struct w8_call_api:
        int abi_version
    const char *W8_CALL_CAPSULE
    enum:
        W8_CALL_ABI_VERSION
    ctypedef struct w8_kv_attention:
        const float *q
        int64_t streams, group, nq, d, q_start
        int query_terms, probability_terms
        int64_t lo_steps, npages, page, span_start
        const w8_plan **key_plans
        const w8_plan **value_plans
        const float *key_scales
        const float *value_scales
        int64_t open_start, open_count, open_room
        const int8_t *open_keys
        const int8_t *open_values
        const float *open_key_scales
        const float *open_value_scales
        int64_t window
        float softcap
        const uint8_t *mask_visible
        const float *mask_add
        int64_t mask_start, mask_cols, mask_sb, mask_sh, mask_sq, kv_per_batch
        float *out
        int64_t out_sb, out_sq, out_sh, block_rows
        const void *isa
        int nthreads
        const w8_call_api *api
    ctypedef struct w8_kv_span:
        int64_t p0, p1, first, T
        int open
    enum:
        W8_KV_OK, W8_KV_QUERY_NOT_FINITE, W8_KV_NO_MEMORY, W8_KV_KERNEL
    int w8_kv_attend(const w8_kv_attention *a)
    w8_kv_span w8_kv_span_of(const w8_kv_attention *a, int64_t lo, int64_t hi)
    int w8_kv_key_sums(const w8_kv_attention *a, int64_t s, w8_kv_span sp, const int8_t *q8,
                       int64_t R, int32_t *S)
    int w8_kv_value_sums(const w8_kv_attention *a, int64_t s, w8_kv_span sp, const int8_t *P,
                         int64_t R, int8_t *cols, int32_t *part, int64_t *acc)
    int w8_int8_terms_row(const float *x, int64_t K, int64_t lo_steps, int8_t *hi,
                          int8_t *lo, float *step)


def int8_terms(const float[:, ::1] x, int8_t[:, ::1] q, float[::1] step, int64_t lo_steps,
               int nthreads):
    """The rows of x (M, K) as int8 terms (`pyw8a8.attention._exact.quantize_terms`): q
    (terms * M, K), the first term's rows then, with two terms (q.shape[0] == 2 M), the
    residual's on the lo_steps finer step; step (M,) the step of each row's combined sum.
    Returns the index of the first row holding NaN or Inf (nothing written for it), or -1.
    """
    cdef int64_t M = x.shape[0], K = x.shape[1], i, bad = -1
    cdef bint two = q.shape[0] == 2 * M
    if q.shape[0] != (2 if two else 1) * M or q.shape[1] != K or step.shape[0] != M:
        raise ValueError("q must have M or 2 M rows of x's K, step M")
    if M == 0 or K == 0:
        return -1
    cdef uint8_t *st = <uint8_t *>calloc(M, 1)
    if st == NULL:
        raise MemoryError(f"no memory for the status of {M} rows")
    with nogil, parallel(num_threads=nthreads):
        for i in prange(M, schedule="static"):
            st[i] = w8_int8_terms_row(&x[i, 0], K, lo_steps, &q[i, 0],
                                      &q[M + i, 0] if two else NULL, &step[i])
    for i in range(M):
        if st[i]:
            bad = i
            break
    free(st)
    return bad


cdef class PlanTable:
    """The plans of a run of full pages, stream by stream, as the attention reads them:
    ``rows[s][p]`` the ``_kernels.WeightPlan`` of stream s's page p (every stream as many),
    which the table keeps alive."""

    cdef const w8_plan **plans
    cdef readonly int64_t streams, pages
    cdef list rows

    def __cinit__(self, list rows):
        self.rows = rows
        self.streams = len(rows)
        self.pages = len(rows[0]) if rows else 0
        self.plans = <const w8_plan **>malloc(max(1, self.streams * self.pages) *
                                              sizeof(w8_plan *))
        if self.plans == NULL:
            raise MemoryError("no memory for a page table")
        for s, row in enumerate(rows):
            if len(row) != self.pages:
                raise ValueError("every stream must have as many pages")
            for p, plan in enumerate(row):
                self.plans[s * self.pages + p] = <const w8_plan *><size_t>plan.address

    def __dealloc__(self):
        free(self.plans)


cdef int _set_store(w8_kv_attention *a, object span, object last, int64_t streams,
                    int64_t d) except -1:
    """The store's pages into `a`: `span` a PackedSpan (its tables, scales, page), `last`
    the open Page or None; checked against the streams and head_dim."""
    cdef PlanTable keys = span.key_table, values = span.value_table
    cdef cnp.ndarray ks, vs, ok, ov, oks, ovs
    a.npages, a.page, a.span_start = keys.pages, span.page, span.start
    if a.npages and (keys.streams != streams or values.streams != streams or
                     values.pages != a.npages):
        raise ValueError("the page tables must have a row per stream")
    a.key_plans, a.value_plans = keys.plans, values.plans
    if a.npages:
        ks, vs = span.key_scales, span.value_scales
        for arr in (ks, vs):
            if arr.dtype != np.float32 or not arr.flags.c_contiguous or arr.shape[0] != \
                    streams or arr.shape[1] != a.npages * a.page:
                raise ValueError("the span's scales must be (streams, tokens) float32")
        a.key_scales = <const float *>cnp.PyArray_DATA(ks)
        a.value_scales = <const float *>cnp.PyArray_DATA(vs)
    a.open_count = 0 if last is None else last.count
    if a.open_count:
        ok, ov, oks, ovs = last.keys, last.values, last.key_scales, last.value_scales
        a.open_start, a.open_room = last.start, ok.shape[1]
        if not (ok.dtype == ov.dtype == np.int8 and ok.flags.c_contiguous and
                ov.flags.c_contiguous and ok.shape[0] == ov.shape[0] == streams and
                ok.shape[2] == ov.shape[2] == d and ov.shape[1] == a.open_room and
                oks.flags.c_contiguous and ovs.flags.c_contiguous and
                oks.dtype == ovs.dtype == np.float32 and oks.shape[1] == ovs.shape[1] ==
                a.open_room and a.open_count <= a.open_room):
            raise ValueError("the open page's rows must be (streams, room, head_dim) int8")
        a.open_keys = <const int8_t *>cnp.PyArray_DATA(ok)
        a.open_values = <const int8_t *>cnp.PyArray_DATA(ov)
        a.open_key_scales = <const float *>cnp.PyArray_DATA(oks)
        a.open_value_scales = <const float *>cnp.PyArray_DATA(ovs)
    elif a.npages:
        a.open_start = a.span_start + a.npages * a.page
    return 0


cdef int _set_kv_mask(w8_kv_attention *a, cnp.ndarray mask, int64_t mask_start) except -1:
    """A 4-D mask (batch, 1 or heads, queries, columns), bool or float32, into `a`."""
    if mask is None:
        return 0
    if mask.ndim != 4 or mask.dtype not in (np.bool_, np.float32):
        raise ValueError("the mask must be 4-D, bool or float32")
    cdef int64_t item = mask.itemsize
    a.mask_start, a.mask_cols = mask_start, mask.shape[3]
    a.mask_sb, a.mask_sh, a.mask_sq = (mask.strides[0] // item, mask.strides[1] // item,
                                       mask.strides[2] // item)
    if mask.shape[1] == 1:
        a.mask_sh = 0
    if mask.strides[3] != item:
        raise ValueError("the mask's columns must be adjacent")
    if mask.dtype == np.bool_:
        a.mask_visible = <const uint8_t *>cnp.PyArray_DATA(mask)
    else:
        a.mask_add = <const float *>cnp.PyArray_DATA(mask)
    return 0


def kv_attention(size_t isa, int nthreads, cnp.ndarray q, int64_t q_start, int query_terms,
                 int probability_terms, int64_t lo_steps, object span, object last,
                 int64_t window, float softcap, cnp.ndarray mask, int64_t mask_start,
                 int64_t kv_per_batch, cnp.ndarray out, int64_t block_rows):
    """int8 attention of one layer (kv_attention.h) on the ISA at `isa` (an
    ``IsaOps.address``): q (streams, group, nq, d) float32,
    C-contiguous (rotated and scaled); the store's full pages `span` and open page `last`;
    out (batch, nq, heads, d) float32 with d adjacent, heads = kv_per_batch * group.
    Returns 0, or 1 where a query row holds NaN or Inf."""
    cdef w8_kv_attention a
    memset(&a, 0, sizeof(a))
    if (q.dtype != np.float32 or not q.flags.c_contiguous or q.ndim != 4 or
            out.dtype != np.float32 or out.ndim != 4 or not out.flags.writeable):
        raise ValueError("q must be (streams, group, nq, d) float32, out 4-D float32")
    a.q, a.streams, a.group, a.nq, a.d = (<const float *>cnp.PyArray_DATA(q), q.shape[0],
                                          q.shape[1], q.shape[2], q.shape[3])
    if (kv_per_batch < 1 or a.streams % kv_per_batch or out.shape[0] != a.streams //
            kv_per_batch or out.shape[1] != a.nq or out.shape[2] != kv_per_batch * a.group
            or out.shape[3] != a.d or out.strides[3] != 4):
        raise ValueError("out must be (batch, nq, heads, d) for q's streams")
    if query_terms not in (1, 2) or probability_terms not in (1, 2):
        raise ValueError("terms must be 1 or 2")
    a.q_start, a.query_terms, a.probability_terms = q_start, query_terms, probability_terms
    a.lo_steps, a.window, a.softcap, a.kv_per_batch = lo_steps, window, softcap, kv_per_batch
    _set_store(&a, span, last, a.streams, a.d)
    _set_kv_mask(&a, mask, mask_start)
    a.out = <float *>cnp.PyArray_DATA(out)
    a.out_sb, a.out_sq, a.out_sh = out.strides[0] // 4, out.strides[1] // 4, out.strides[2] // 4
    a.block_rows, a.isa, a.nthreads, a.api = block_rows, <const void *>isa, nthreads, _API
    cdef int status
    with nogil:
        status = w8_kv_attend(&a)
    if status == W8_KV_NO_MEMORY:
        raise MemoryError("no memory for int8 attention's scratch")
    if status == W8_KV_KERNEL:
        raise RuntimeError("int8 attention: a page's product failed")
    return 1 if status == W8_KV_QUERY_NOT_FINITE else 0


def kv_sums(size_t isa, cnp.ndarray rows, object span, object last, int64_t stream,
            int64_t d, bint keys):
    """The exact products of int8 rows with every token of one stream, as int8 attention
    takes them: ``rows (R, d) . keys`` (R, tokens) int32 with `keys`, else ``rows (R,
    tokens) . values`` (R, d) int64 (the tests' window on kv_attention.h)."""
    cdef w8_kv_attention a
    memset(&a, 0, sizeof(a))
    a.d, a.isa, a.api = d, <const void *>isa, _API
    streams = span.key_scales.shape[0] if span.count else last.keys.shape[0]
    _set_store(&a, span, last, streams, d)
    cdef w8_kv_span sp = w8_kv_span_of(&a, -(1 << 62), 1 << 62)
    cdef int64_t R = rows.shape[0]
    if rows.dtype != np.int8 or not rows.flags.c_contiguous or rows.shape[1] != (
            d if keys else sp.T) or not 0 <= stream < streams:
        raise ValueError("rows must be C-contiguous int8 of the stream's width")
    cdef cnp.ndarray out = np.empty((R, sp.T) if keys else (R, d),
                                    np.int32 if keys else np.int64)
    cdef cnp.ndarray cols = np.empty(max(1, R * a.page), np.int8)
    cdef cnp.ndarray part = np.empty(max(1, R * d), np.int32)
    cdef int status
    if keys:
        status = w8_kv_key_sums(&a, stream, sp, <const int8_t *>cnp.PyArray_DATA(rows), R,
                                <int32_t *>cnp.PyArray_DATA(out))
    else:
        status = w8_kv_value_sums(&a, stream, sp, <const int8_t *>cnp.PyArray_DATA(rows), R,
                                  <int8_t *>cnp.PyArray_DATA(cols),
                                  <int32_t *>cnp.PyArray_DATA(part),
                                  <int64_t *>cnp.PyArray_DATA(out))
    if status != W8_KV_OK:
        raise RuntimeError("int8 attention: a page's product failed")
    return out


cdef const w8_call_api *_API = <const w8_call_api *>PyCapsule_GetPointer(_kernels.CALL_API,
                                                                         W8_CALL_CAPSULE)
if _API == NULL or _API.abi_version != W8_CALL_ABI_VERSION:
    raise ImportError("pyw8a8._attention: pyw8a8._kernels's call table is not this build's")


def float_attention(const float[:, :, :, :] q, const float[:, :, :, :] k,
                    const float[:, :, :, :] v, const uint8_t[:, :, :, :] mask_bool,
                    const float[:, :, :, :] mask_add, float[:, :, :, :] out, float scale,
                    bint causal, int nthreads):
    """out = softmax(scale * q k^T + mask) v over float32 keys and values
    (``_simd/float_attention.h``).

    q and out (B, Hq, Lq, D), k and v (B, Hkv, Lk, D) with Hkv dividing Hq (each KV head
    serves Hq / Hkv query heads), any strides but a unit one along D.  At most one mask:
    mask_bool (uint8, 0 hides a key) or mask_add (added to the scores), (B, Hq, Lq, Lk)
    with a unit key stride (0 strides where broadcast).  causal: query i sees keys 0..i.
    A row that sees no key gets zeros.  Tasks (one batch row and query head each) run in
    OpenMP ``prange`` on `nthreads` threads."""
    cdef int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], D = q.shape[3]
    cdef int64_t Hkv = k.shape[1], Lk = k.shape[2], i
    cdef bint fits = k.shape[0] == B and k.shape[3] == D and Hkv >= 1 and Hq % Hkv == 0
    for i in range(4):
        fits = fits and v.shape[i] == k.shape[i] and out.shape[i] == q.shape[i]
    # (a dimension of one value has any stride: numpy's buffer may report another than 4)
    fits = fits and (D <= 1 or (q.strides[3] == 4 and k.strides[3] == 4 and
                                v.strides[3] == 4 and out.strides[3] == 4))
    if not fits:
        raise ValueError("float_attention needs q and out (B, Hq, Lq, D), k and v "
                         "(B, Hkv, Lk, D), Hkv dividing Hq, each with a unit stride along D")
    cdef w8_float_attention a
    memset(&a, 0, sizeof(a))
    _set_float_mask(&a, mask_bool, mask_add, B, Hq, Lq, Lk)
    if B == 0 or Hq == 0 or Lq == 0 or D == 0:
        return
    a.q, a.out = &q[0, 0, 0, 0], &out[0, 0, 0, 0]
    if Lk:
        a.k, a.v = &k[0, 0, 0, 0], &v[0, 0, 0, 0]
    for i in range(3):
        a.qs[i], a.ks[i] = q.strides[i] // 4, k.strides[i] // 4
        a.vs[i], a.os[i] = v.strides[i] // 4, out.strides[i] // 4
    a.causal = causal
    a.B, a.Hq, a.Hkv, a.Lq, a.Lk, a.D, a.scale = B, Hq, Hkv, Lq, Lk, D, scale
    _attend(&a, nthreads)


cdef int _set_float_mask(w8_float_attention *a, const uint8_t[:, :, :, :] mask_bool,
                   const float[:, :, :, :] mask_add, int64_t B, int64_t Hq, int64_t Lq,
                   int64_t Lk) except -1:
    """float_attention's mask (at most one), checked, into `a`."""
    cdef int64_t[4] mshape
    cdef int i
    if mask_bool is not None and mask_add is not None:
        raise ValueError("float_attention takes one mask, bool or additive")
    if mask_bool is None and mask_add is None:
        return 0
    for i in range(4):
        mshape[i] = mask_bool.shape[i] if mask_bool is not None else mask_add.shape[i]
    if (mshape[0] != B or mshape[1] != Hq or mshape[2] != Lq or mshape[3] != Lk or
            (Lk > 1 and (mask_bool.strides[3] != 1 if mask_bool is not None
                         else mask_add.strides[3] != 4))):
        raise ValueError("the mask must be (B, Hq, Lq, Lk) with a unit key stride "
                         "(0 strides where broadcast)")
    for i in range(3):
        a.ms[i] = (mask_bool.strides[i] if mask_bool is not None
                   else mask_add.strides[i] // 4)
    if mask_bool is not None and B and Hq and Lq and Lk:
        a.mask_bool = &mask_bool[0, 0, 0, 0]
    elif mask_add is not None and B and Hq and Lq and Lk:
        a.mask_add = &mask_add[0, 0, 0, 0]
    return 0


cdef int _attend(w8_float_attention *a, int nthreads) except -1:
    """float_attention's tasks (a batch row and query head each), on up to `nthreads`."""
    cdef int64_t t, tasks = a.B * a.Hq, per_thread = w8_fa_scratch_floats(a)
    cdef int64_t heads = w8_fa_span_heads(a), rows = a.B * heads, Lq = a.Lq
    cdef int threads = <int>max(1, min(nthreads, tasks))
    cdef float *scratch = <float *>malloc(per_thread * threads * sizeof(float))
    cdef w8_fa_span *spans = <w8_fa_span *>malloc(rows * Lq * sizeof(w8_fa_span))
    if scratch == NULL or spans == NULL:
        free(scratch)
        free(spans)
        raise MemoryError(f"no memory for {threads} threads' scratch of {per_thread} floats "
                          f"and {rows * Lq} query rows' spans")
    cdef w8_master_place master
    if threads == 1:
        with nogil:
            for t in range(rows):
                w8_fa_spans(a, t // heads, t % heads, spans + t * Lq)
            for t in range(tasks):
                w8_float_attention_task(a, t, spans, scratch)
    else:
        master = w8_master_here()
        with nogil, parallel(num_threads=threads):
            w8_join_team(master)
            for t in prange(rows, schedule="static"):
                w8_fa_spans(a, t // heads, t % heads, spans + t * Lq)
            for t in prange(tasks, schedule="dynamic"):
                w8_float_attention_task(a, t, spans, scratch + threadid() * per_thread)
    free(scratch)
    free(spans)
    return 0
