/* The Arm microkernel on the one tile both Arm ISAs share, included by neon.h once per dot
 * step (neon's widening multiply, neondot's sdot) with W8_UK, W8_UK_TARGET and W8_UK_DOT
 * defined: this file states the rest of ukernel.h's traits and includes it, which undefines
 * them all.  The tile: 4 rows x 4 int32x4 (one panel, 16 channels) = 16 accumulators; with
 * the 4 B vectors and the broadcast row they use 21 of the 32 NEON registers. */
#define W8_UK_MR W8_NEON_MR
#define W8_UK_NVEC 4
#define W8_UK_A int8x16_t
#define W8_UK_B int8x16_t
#define W8_UK_BCAST w8_neon_bcast
#define W8_UK_LOAD_B w8_neon_load_b
#include "ukernel.h"
