// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Compiles only if gradcomp::cuda gives CUDA sources what the backend needs: nvcc in C++20
// mode, the CUDA runtime and Thrust on the include path, gradcomp's headers. Runs host code only.

#include <gradcomp/cuda/config.cuh>
#include <gradcomp/gradcomp.hpp>

#include <cstdio>

static_assert(__cplusplus >= 202002L, "gradcomp::cuda must compile CUDA sources as C++20");

#if defined(GRADCOMP_EXPECTED_MAJOR)
static_assert(GRADCOMP_VERSION_MAJOR == GRADCOMP_EXPECTED_MAJOR &&
                  GRADCOMP_VERSION_MINOR == GRADCOMP_EXPECTED_MINOR &&
                  GRADCOMP_VERSION_PATCH == GRADCOMP_EXPECTED_PATCH,
              "the gradcomp headers found are not the version under test");
#endif

int main() {
  std::printf("gradcomp %d.%d.%d for CUDA (kernels on the GPU: %s)\n", GRADCOMP_VERSION_MAJOR,
              GRADCOMP_VERSION_MINOR, GRADCOMP_VERSION_PATCH, GRADCOMP_CUDA_ON_GPU ? "yes" : "no");
  return 0;
}
