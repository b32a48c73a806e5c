// check_cuda.h: CK(call) -- stop a standalone tool with the CUDA error, file and line.
#ifndef MOESPEC_TOOLS_CHECK_CUDA_H
#define MOESPEC_TOOLS_CHECK_CUDA_H

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(call)                                                                                     \
  do {                                                                                               \
    cudaError_t e_ = (call);                                                                         \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);  \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

#endif  // MOESPEC_TOOLS_CHECK_CUDA_H
