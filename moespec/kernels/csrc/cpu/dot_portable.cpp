// Dot kernels of the portable path (any x86-64 CPU; MOESPEC_CPU_ISA=portable).
#include "dot_generic.h"

namespace moespec {

MOESPEC_ROWS_FNS(portable)

}  // namespace moespec
