/* The ukernel.h traits of a NEON tile, shared by the NEON and NEON dot product kernels
 * (neon.h), which differ only in name, target and dot step: one 16-channel panel is four
 * int32x4 of sums.  neon.h defines those three traits, includes this file, then ukernel.h,
 * which undefines all of them: hence no include guard, this file is included once per
 * instantiation. */
#define W8_UK_MR W8_NEON_MR
#define W8_UK_VPP 4
#define W8_UK_NVEC 4
#define W8_UK_VEC int32x4_t
#define W8_UK_ZERO() vdupq_n_s32(0)
#define W8_UK_BVEC int8x16_t
#define W8_UK_BZERO() vdupq_n_s8(0)
#define W8_UK_AVEC int8x16_t
#define W8_UK_LOAD(p) vld1q_s32(p)
#define W8_UK_STORE(p, v) vst1q_s32(p, v)
#define W8_UK_ADD(x, y) vaddq_s32(x, y)
#define W8_UK_BCAST(p) w8_neon_bcast(p)
#define W8_UK_LOAD_B(p, BIASED) w8_neon_load_b(p, BIASED)
#define W8_UK_PREP_B(b) (b)
#define W8_UK_STORE_FLOAT(p, sums, fin, r, col) w8_neon_store_float(p, sums, fin, r, col)
