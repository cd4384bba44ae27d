// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Configuration of the CUDA backend: the error type and checking helper every CUDA call goes
/// through, and the switch between the two places the backend can run.
///
/// The backend's algorithms are written over Thrust execution policies. Which system Thrust's
/// "device" is decides where they run:
///
/// - `THRUST_DEVICE_SYSTEM_CUDA` (the default): kernels on the GPU, pointers named `d_*` are
///   device memory, work is ordered on the caller's `cudaStream_t`;
/// - `THRUST_DEVICE_SYSTEM_CPP` (compile with `-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP`):
///   the same functors run sequentially on the calling host thread, "device" pointers are host
///   pointers and streams are ignored. This is how the backend is checked on machines without a
///   GPU (tests/cuda/host_backend.cu). Nothing then runs as a kernel, so a translation unit of
///   this kind may also be compiled by the host C++ compiler alone, with the CUDA toolkit's
///   include directories (`include` and `include/cccl`, where Thrust is) on its path: the
///   host-emulation tests are built that way (tests/cuda/CMakeLists.txt). Any other device system
///   needs nvcc.
///
/// `GRADCOMP_CUDA_ON_GPU` is 1 in the first case and 0 in the second.

// Without nvcc only the CPP system compiles: said before Thrust is read (its default system is
// CUDA), and checked once its configuration has given the system names their values.
#if !defined(__CUDACC__) && !defined(THRUST_DEVICE_SYSTEM)
#  error "gradcomp/cuda/*.cuh need a CUDA compiler (or, for the host emulation, -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP); the CPU codecs are in gradcomp/codec/"
#endif

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <cuda_runtime.h>
#include <thrust/execution_policy.h>

#include <string>

#if !defined(__CUDACC__) && THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CPP
#  error "gradcomp/cuda/*.cuh need a CUDA compiler unless THRUST_DEVICE_SYSTEM is THRUST_DEVICE_SYSTEM_CPP"
#endif

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#  define GRADCOMP_CUDA_ON_GPU 1
#else
#  define GRADCOMP_CUDA_ON_GPU 0
#endif

/// `#pragma unroll` for a loop in a host/device function: applied in device compilation,
/// left out of the host pass (where the host compiler would warn about an unknown pragma).
#if defined(__CUDA_ARCH__)
#  define GRADCOMP_CUDA_UNROLL _Pragma("unroll")
#else
#  define GRADCOMP_CUDA_UNROLL
#endif

// Everything that depends on the Thrust device system lives in an inline namespace named after
// it, so a program that links a CPP-system translation unit with a CUDA one (a test next to the
// real thing) gets two distinct sets of symbols instead of an ODR violation. Code names the
// entities as gradcomp::cuda::... either way.
#if GRADCOMP_CUDA_ON_GPU
#  define GRADCOMP_CUDA_SYSTEM_NAMESPACE system_cuda
#else
#  define GRADCOMP_CUDA_SYSTEM_NAMESPACE system_cpp
#endif
/// Opens `gradcomp::cuda` (and its inline, device-system-specific namespace).
#define GRADCOMP_CUDA_NAMESPACE_BEGIN \
  GRADCOMP_NAMESPACE_BEGIN            \
  namespace cuda {                    \
  inline namespace GRADCOMP_CUDA_SYSTEM_NAMESPACE {
#define GRADCOMP_CUDA_NAMESPACE_END \
  }                                 \
  }                                 \
  GRADCOMP_NAMESPACE_END

GRADCOMP_NAMESPACE_BEGIN
namespace cuda {

/// A failed CUDA runtime call (or a failed kernel launch reported through Thrust). The message
/// names the call, where it was made and the runtime's description of the error.
class cuda_error : public error {
 public:
  cuda_error(cudaError_t code, std::string const& what) : error(what), code_(code) {}

  /// The CUDA runtime's error code.
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

/// Throws `cuda_error` unless `status` is `cudaSuccess`. `what` names the failed call; `file`
/// and `line` say where it was made. Clears the runtime's sticky last-error state for
/// non-sticky errors so that a later check does not report the same failure again.
inline void check(cudaError_t status, char const* what, char const* file, int line) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw cuda_error(status, std::string("gradcomp: CUDA call ") + what + " failed at " + file + ":" +
                               std::to_string(line) + ": " + cudaGetErrorName(status) + " (" +
                               cudaGetErrorString(status) + ")");
}

}  // namespace cuda
GRADCOMP_NAMESPACE_END

/// Evaluates a CUDA runtime call and throws `gradcomp::cuda::cuda_error` if it failed.
#define GRADCOMP_CUDA_CHECK(call) ::gradcomp::cuda::check((call), #call, __FILE__, __LINE__)
