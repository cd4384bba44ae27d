// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The few places where the CUDA backend touches the runtime: the Thrust policy for a stream,
/// copies of small values back to the host, copies within device memory, stream
/// synchronization, stream-ordered scratch memory, and the translation of Thrust's launch
/// errors into `cuda_error`. Everything here has a host twin selected by `GRADCOMP_CUDA_ON_GPU`
/// (see cuda/config.cuh).

#include <gradcomp/cuda/config.cuh>

#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>

#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system_error.h>
#if GRADCOMP_CUDA_ON_GPU
#  include <thrust/system/cuda/execution_policy.h>
#endif

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// The Thrust execution policy the codecs run on: asynchronous on `stream` when on the GPU,
/// Thrust's sequential host system otherwise.
inline auto policy([[maybe_unused]] cudaStream_t stream) {
#if GRADCOMP_CUDA_ON_GPU
  return thrust::cuda::par_nosync.on(stream);
#else
  return thrust::cpp::par;
#endif
}

/// Enqueues a copy of `bytes` bytes from backend memory `src` to host memory `dst` on `stream`.
/// The host may read `dst` only after `synchronize(stream)`.
inline void copy_to_host(void* dst, void const* src, std::size_t bytes,
                         [[maybe_unused]] cudaStream_t stream) {
  if (bytes == 0) return;
#if GRADCOMP_CUDA_ON_GPU
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Enqueues a copy of `bytes` bytes from host memory `src` to backend memory `dst` on `stream`
/// (from pageable memory the runtime may wait until `src` has been read).
inline void copy_from_host(void* dst, void const* src, std::size_t bytes,
                           [[maybe_unused]] cudaStream_t stream) {
  if (bytes == 0) return;
#if GRADCOMP_CUDA_ON_GPU
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Enqueues a copy of `bytes` bytes from backend memory `src` to backend memory `dst` on
/// `stream` (the ranges do not overlap).
inline void copy_on_device(void* dst, void const* src, std::size_t bytes,
                           [[maybe_unused]] cudaStream_t stream) {
  if (bytes == 0) return;
#if GRADCOMP_CUDA_ON_GPU
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Enqueues setting `bytes` bytes of backend memory at `dst` to `value` on `stream`.
inline void fill_bytes(void* dst, int value, std::size_t bytes,
                       [[maybe_unused]] cudaStream_t stream) {
  if (bytes == 0) return;
#if GRADCOMP_CUDA_ON_GPU
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream));
#else
  std::memset(dst, value, bytes);
#endif
}

/// Waits until all work enqueued on `stream` has finished.
inline void synchronize([[maybe_unused]] cudaStream_t stream) {
#if GRADCOMP_CUDA_ON_GPU
  GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
}

/// Runs `fn` and rethrows a Thrust `system_error` (a failed kernel launch or allocation inside
/// Thrust) as `cuda_error`, so callers only ever see the gradcomp hierarchy.
template <class Fn>
decltype(auto) translate_thrust_errors(Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (thrust::system_error const& e) {
    throw cuda_error(static_cast<cudaError_t>(e.code().value()),
                     std::string("gradcomp: CUDA backend: ") + e.what());
  }
}

/// Scratch memory owned for the duration of one call: `cudaMallocAsync` / `cudaFreeAsync` on the
/// caller's stream (so it is stream-ordered like the work that uses it), or host memory.
class scratch {
 public:
  scratch(std::size_t bytes, [[maybe_unused]] cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
#if GRADCOMP_CUDA_ON_GPU
    GRADCOMP_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
#else
    host_ = std::make_unique<std::byte[]>(bytes);
    ptr_ = host_.get();
#endif
  }
  scratch(scratch const&) = delete;
  scratch& operator=(scratch const&) = delete;
  ~scratch() {
#if GRADCOMP_CUDA_ON_GPU
    // A destructor cannot report failure; a failed free surfaces at the next checked call.
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
#endif
  }

  [[nodiscard]] void* get() const noexcept { return ptr_; }

 private:
  void* ptr_ = nullptr;
  [[maybe_unused]] cudaStream_t stream_;
#if !GRADCOMP_CUDA_ON_GPU
  std::unique_ptr<std::byte[]> host_;
#endif
};

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
