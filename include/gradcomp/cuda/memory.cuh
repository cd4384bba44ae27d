// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Device memory for the collectives: `device_buffer` (an owning, growable buffer of device
/// bytes), `device_memory` (the memory space of collective/memory.hpp whose payloads live on
/// the device, ordered on a CUDA stream: zero, copy, scale, read) and `memory_kind_of` (is a
/// pointer device memory?).
///
/// Under Thrust's CPP system (`GRADCOMP_CUDA_ON_GPU` 0, cuda/config.cuh) "device" memory is
/// host memory: a **host emulation** of the GPU. `device_buffer` then allocates on the host and
/// records the allocation in a process-wide table, so that `memory_kind_of` can still tell a
/// payload (a `device_buffer`) from a control message (any other host memory), as
/// `cudaPointerGetAttributes` does on a GPU. Tests use it to check that payloads stay on the
/// "device"; nothing else differs.

#include <gradcomp/cuda/config.cuh>

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/cuda/detail/elements.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>
#include <gradcomp/cuda/detail/stats.cuh>
#include <gradcomp/cuda/detail/workspace.cuh>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>

#include <thrust/transform.h>

GRADCOMP_CUDA_NAMESPACE_BEGIN

/// Where a pointer points.
enum class memory_kind : std::uint8_t {
  host = 0,    ///< host memory (pageable or pinned): control messages
  device = 1,  ///< device (or managed) memory: payloads
};

namespace detail {

#if !GRADCOMP_CUDA_ON_GPU
/// Host emulation only: the live `device_buffer` allocations, by start address.
struct emulated_allocations {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> blocks;

  static emulated_allocations& get() {
    static emulated_allocations table;
    return table;
  }
  void add(void const* p, std::size_t bytes) {
    std::lock_guard lock(mutex);
    blocks[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  }
  void remove(void const* p) {
    std::lock_guard lock(mutex);
    blocks.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  bool contains(void const* p) {
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(mutex);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return false;
    --it;
    return a < it->first + it->second;
  }
};
#endif

/// `x * alpha`, one rounded float32 product (nvcc keeps IEEE multiplication, with
/// subnormals, unless told `-ftz=true` or `--use_fast_math`): the host's `x *= alpha`.
struct scale_by {
  float alpha;
  GRADCOMP_HOST_DEVICE float operator()(float x) const noexcept { return x * alpha; }
};

/// An element widened to float32 (exact): the host's `widen_to_f32`.
template <class T>
struct widen_fn {
  GRADCOMP_HOST_DEVICE float operator()(T v) const noexcept { return to_float(v); }
};

/// `acc + float(v)`: one rounded float32 sum of the accumulator and the widened element (the
/// host's `acc += v` after widening; `cpu::kernels::axpy_f32` with alpha 1 and `widen` with add).
template <class T>
struct widen_add_fn {
  GRADCOMP_HOST_DEVICE float operator()(T v, float acc) const noexcept { return acc + to_float(v); }
};

/// A float32 rounded once to `T` (nearest even): the host's `round_from_f32`.
template <class T>
struct narrow_fn {
  GRADCOMP_HOST_DEVICE T operator()(float v) const noexcept { return from_float<T>(v); }
};

}  // namespace detail

/// Whether `p` points into device memory. On a GPU: `cudaPointerGetAttributes` (device and
/// managed memory are device memory; pageable, pinned and unregistered host memory are host
/// memory). In the host emulation: whether `p` lies in a live `device_buffer`.
inline memory_kind memory_kind_of(void const* p) {
  if (p == nullptr) return memory_kind::host;
#if GRADCOMP_CUDA_ON_GPU
  cudaPointerAttributes a{};
  GRADCOMP_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? memory_kind::device
                                                                           : memory_kind::host;
#else
  return detail::emulated_allocations::get().contains(p) ? memory_kind::device : memory_kind::host;
#endif
}

/// An owning buffer of device bytes, allocated and freed stream-ordered (`cudaMallocAsync`,
/// `cudaFreeAsync`) on its stream. Growing never shrinks the allocation; `resize` keeps the
/// contents only when the new size fits the capacity (the collectives write before they read).
/// Move-only.
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(cudaStream_t stream) noexcept : stream_(stream) {}
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  device_buffer(device_buffer&& o) noexcept
      : stream_(o.stream_),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        cap_(std::exchange(o.cap_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      stream_ = o.stream_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  ~device_buffer() { release(); }

  /// Sets the size to `n` bytes, allocating when `n` exceeds the capacity (`cuda_error` if the
  /// allocation fails; the buffer is then as before).
  void resize(std::size_t n) {
    if (n > cap_) {
      void* p = nullptr;
#if GRADCOMP_CUDA_ON_GPU
      GRADCOMP_CUDA_CHECK(cudaMallocAsync(&p, n, stream_));
#else
      p = ::operator new (n, std::align_val_t{256});
      detail::emulated_allocations::get().add(p, n);
#endif
      release();
      data_ = static_cast<std::byte*>(p);
      cap_ = n;
    }
    size_ = n;
  }

  [[nodiscard]] std::byte* data() noexcept { return data_; }
  [[nodiscard]] std::byte const* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::span<std::byte> span() noexcept { return {data_, size_}; }
  [[nodiscard]] std::span<std::byte const> span() const noexcept { return {data_, size_}; }
  /// The stream its allocations are ordered on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
#if GRADCOMP_CUDA_ON_GPU
    // A destructor cannot report failure; a failed free surfaces at the next checked call.
    (void)cudaFreeAsync(data_, stream_);
#else
    detail::emulated_allocations::get().remove(data_);
    ::operator delete (data_, std::align_val_t{256});
#endif
    data_ = nullptr;
    size_ = 0;
    cap_ = 0;
  }

  cudaStream_t stream_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

namespace detail {
/// `bucket_stats`' finish of a one-bucket sum: stores it.
struct store_sum {
  double* out;
  GRADCOMP_HOST_DEVICE void operator()(std::uint64_t, double s) const noexcept { *out = s; }
};
}  // namespace detail

/// The memory space (collective/memory.hpp) of payloads on the device: `device_buffer`s on
/// `stream`, zeroed with `cudaMemsetAsync`, read by the host through a copy after which the
/// host waits for `stream`.
struct device_memory {
  /// Owning payload buffer.
  using buffer = device_buffer;
  /// The host does not touch payload bytes directly.
  static constexpr bool on_host = false;

  /// The stream payload work is ordered on (that of the codec and of the communicator).
  cudaStream_t stream = nullptr;

  /// An empty buffer on `stream`.
  [[nodiscard]] buffer make_buffer() const noexcept { return buffer(stream); }
  /// Sets `bytes` (device memory) to zero, enqueued on `stream`.
  void zero(std::span<std::byte> bytes) const {
    detail::fill_bytes(bytes.data(), 0, bytes.size(), stream);
  }
  /// Copies `src` into `dst` (device memory, the same size, no overlap), enqueued on `stream`.
  void copy(std::span<std::byte> dst, std::span<std::byte const> src) const {
    detail::copy_on_device(dst.data(), src.data(), dst.size(), stream);
  }
  /// `x[i] = x[i] * alpha` (device memory), enqueued on `stream`: the bits of
  /// `host_memory::scale`.
  void scale(std::span<float> x, float alpha) const {
    if (x.empty()) return;
    detail::translate_thrust_errors([&] {
      thrust::transform(detail::policy(stream), x.data(), x.data() + x.size(), x.data(),
                        detail::scale_by{alpha});
    });
  }
  /// Copies `bytes` (device memory) to the host after the work enqueued on `stream`, waits, and
  /// returns `f(host copy)`.
  template <class F>
  decltype(auto) read(std::span<std::byte const> bytes, F&& f) const {
    auto const host = std::make_unique_for_overwrite<std::byte[]>(bytes.size());
    detail::copy_to_host(host.get(), bytes.data(), bytes.size(), stream);
    detail::synchronize(stream);
    return std::forward<F>(f)(std::span<std::byte const>(host.get(), bytes.size()));
  }
  /// Copies host bytes into `dst` (device memory, as many bytes as `dst` holds), enqueued on
  /// `stream`; `host` may be reused once this returns (the runtime stages pageable memory).
  void write(std::span<std::byte> dst, std::span<std::byte const> host) const {
    detail::copy_from_host(dst.data(), host.data(), dst.size(), stream);
  }
  /// `dst` = `src` widened to float32 (exact), both device memory of the same size, enqueued on
  /// `stream`: the bits of the host's `widen_to_f32` (collective/common.hpp).
  template <element T>
  void widen(std::span<T const> src, std::span<float> dst) const {
    if (src.empty()) return;
    detail::translate_thrust_errors([&] {
      thrust::transform(detail::policy(stream), src.data(), src.data() + src.size(), dst.data(), detail::widen_fn<T>{});
    });
  }
  /// `acc[i] += float(x[i])`, one rounded float32 sum per element, both device memory of the
  /// same size, enqueued on `stream`: the hierarchical all-reduce's node sums (the bits of the
  /// host's `axpy_f32` with alpha 1, and of its `widen` with add for 16-bit `T`).
  template <element T>
  void add(std::span<T const> x, std::span<float> acc) const {
    if (x.empty()) return;
    detail::translate_thrust_errors([&] {
      thrust::transform(detail::policy(stream), x.data(), x.data() + x.size(), acc.data(), acc.data(),
                        detail::widen_add_fn<T>{});
    });
  }
  /// `dst` = `src` rounded once to `T` (nearest even), device memory, enqueued on `stream`: the
  /// bits of the host's `round_from_f32`.
  template <element T>
  void narrow(std::span<float const> src, std::span<T> dst) const {
    if (src.empty()) return;
    detail::translate_thrust_errors([&] {
      thrust::transform(detail::policy(stream), src.data(), src.data() + src.size(), dst.data(), detail::narrow_fn<T>{});
    });
  }
  /// Σ x² of `x` (device memory), in double, in the canonical order: the bits of
  /// `host_memory::sum_of_squares`. The statistics passes of cuda/detail/stats.cuh over one
  /// bucket of the whole tensor (16 lanes per 4096-element block, blocks in order), then one
  /// 8-byte copy to the host and a wait for `stream`. Its partials (about 2 % of x's bytes) are
  /// allocated stream-ordered for the call.
  [[nodiscard]] double sum_of_squares(std::span<float const> x) const {
    if (x.empty()) return 0.0;
    detail::bucket_geometry const geo = detail::bucket_geometry::of(0, x.size());
    detail::arena count(nullptr);
    (void)detail::stats_workspace<detail::sumsq_stat>::carve(count, geo);
    (void)count.take<double>(1);
    device_buffer work(stream);
    work.resize(count.used() + detail::arena::slack);
    detail::arena a(work.data());
    auto const ws = detail::stats_workspace<detail::sumsq_stat>::carve(a, geo);
    double* const sum = a.take<double>(1);
    detail::translate_thrust_errors([&] {
      detail::bucket_stats<detail::sumsq_stat>(detail::policy(stream), geo, detail::plain_input<float>{x.data()},
                                               ws, detail::store_sum{sum});
    });
    double host = 0.0;
    detail::copy_to_host(&host, sum, sizeof host, stream);
    detail::synchronize(stream);
    return host;
  }
};

GRADCOMP_CUDA_NAMESPACE_END
