# The C core's constants that Python reads as attributes of _kernels (cpdef enum): the
# layout, the encodings, the output kinds and the fused activations. Everything else of
# the C core is declared in _core.pxd.
cdef extern from "_simd/dispatch.h" nogil:
    cpdef enum:
        W8_NR
        W8_KPAD
        W8_A_ROW_PAD
        W8_EXACT_K
        W8_ENC_BIASED
        W8_ENC_SIGNED
        W8_OUT_F32
        W8_OUT_I32
        W8_OUT_I64
        W8_ACT_NONE
        W8_ACT_RELU
        W8_ACT_GELU
        W8_ACT_GELU_TANH
        W8_ACT_SILU
