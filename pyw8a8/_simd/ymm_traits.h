/* The ukernel.h traits of a ymm tile, shared by the AVX2 (avx2.h) and AVX-VNNI (avxvnni.h)
 * kernels: one 16-channel panel is two ymm of 8 int32 sums.  The including header adds the
 * traits of its own (W8_UK, W8_UK_TARGET, W8_UK_MR, W8_UK_NVEC, W8_UK_AVEC, W8_UK_BCAST,
 * W8_UK_LOAD_B, W8_UK_PREP_B, W8_UK_DOT)
 * and then includes ukernel.h, which undefines all of them: hence no include guard, this
 * file is included once per instantiation. */
#define W8_UK_VPP 2
#define W8_UK_VEC __m256i
#define W8_UK_ZERO() _mm256_setzero_si256()
#define W8_UK_BVEC __m256i
#define W8_UK_BZERO() _mm256_setzero_si256()
#define W8_UK_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define W8_UK_STORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define W8_UK_ADD(x, y) _mm256_add_epi32(x, y)
#define W8_UK_STORE_FLOAT(p, sums, fin, r, col) w8_avx2_store_float(p, sums, fin, r, col)
