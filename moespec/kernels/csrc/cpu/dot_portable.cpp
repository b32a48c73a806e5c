// Dot kernels of the portable path (any x86-64 CPU; MOESPEC_CPU_ISA=portable).
#include "dot_generic.h"

namespace moespec {

#define C_F32P(N) dot_f32_generic<N>(wr, K, a, sums)
#define C_BF16P(N) dot_bf16_generic<N>(wr, K, a, sums)
#define C_I8P(N) dot_i8_generic<N>(wr, wsr, K, a, sums)
MOESPEC_ROWS_FN(dot_f32_portable_fn, float, C_F32P)
MOESPEC_ROWS_FN(dot_bf16_portable_fn, uint16_t, C_BF16P)
MOESPEC_ROWS_FN(dot_i8_portable_fn, uint8_t, C_I8P)

}  // namespace moespec
