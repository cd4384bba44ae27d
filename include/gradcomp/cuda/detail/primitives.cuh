// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Device-wide primitives of the sparsifiers, on the caller's workspace: a histogram of
/// integer samples, a stable compaction of 32-bit indices, an inclusive prefix sum and a key
/// sort. On the GPU they are CUB's (`DeviceHistogram::HistogramEven`, `DeviceSelect::If`,
/// `DeviceScan::InclusiveSum`, `DeviceRadixSort::SortKeys`), whose temporary storage is carved
/// from the codec's workspace (CUB's two-phase queries; no allocation); under Thrust's CPP
/// system they are sequential loops with the same results (a stable compaction keeps index
/// order; the histogram, sum and sort are exact), so the host tests check the same packets.
///
/// Every primitive takes its input through an iterator of positions (a `counting_iterator`
/// turned into samples, keys or flags by a functor), so the caller fuses the filtering of its
/// candidates with the pass that reads them.

#include <gradcomp/cuda/config.cuh>
#include <gradcomp/cuda/detail/runtime.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#if GRADCOMP_CUDA_ON_GPU
#  include <cub/device/device_histogram.cuh>
#  include <cub/device/device_radix_sort.cuh>
#  include <cub/device/device_scan.cuh>
#  include <cub/device/device_select.cuh>
#endif

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// Positions 0, 1, ... as an iterator.
using position_iterator = thrust::counting_iterator<std::uint64_t>;

/// `fn(position)` as an iterator over positions 0, 1, ...
template <class Fn>
thrust::transform_iterator<Fn, position_iterator> over_positions(Fn fn) {
  return thrust::transform_iterator<Fn, position_iterator>(position_iterator(0), fn);
}

/// A sample that no histogram bin counts (filtered out).
inline constexpr int no_bin = -1;

/// Selection predicate of `select_temp_bytes` queries (CUB sizes a compaction's temporary
/// storage by its tile count, which depends on the item type, not on the predicate).
struct probe_flag {
  GRADCOMP_HOST_DEVICE bool operator()(std::uint32_t) const noexcept { return false; }
};
/// Summand of `scan_temp_bytes` queries.
struct probe_term {
  GRADCOMP_HOST_DEVICE std::uint64_t operator()(std::uint64_t) const noexcept { return 0; }
};

#if GRADCOMP_CUDA_ON_GPU
/// Throws `cuda_error` when a primitive is handed less temporary storage than CUB asks for
/// (the workspace was sized with another sample or predicate type: a bug, never silent).
inline void check_temp(std::size_t need, std::size_t have, char const* what) {
  if (need > have) {
    throw cuda_error(cudaErrorInvalidValue, std::string("gradcomp: cuda ") + what + " needs " +
                                                std::to_string(need) + " temporary bytes, the " +
                                                "workspace holds " + std::to_string(have));
  }
}
#endif

/// Temporary bytes of `histogram` over `n` samples of `samples` (an iterator of the type the
/// call will use: CUB sizes its per-block bins by the occupancy of the kernel it instantiates
/// for that type) into `bins` bins.
template <class SampleIt>
std::size_t histogram_temp_bytes([[maybe_unused]] SampleIt samples, [[maybe_unused]] std::uint64_t n,
                                 [[maybe_unused]] int bins) {
#if GRADCOMP_CUDA_ON_GPU
  std::size_t bytes = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceHistogram::HistogramEven(
      nullptr, bytes, samples, static_cast<unsigned*>(nullptr), bins + 1, 0, bins,
      static_cast<std::int64_t>(n), cudaStream_t{}));
  return bytes;
#else
  return 0;
#endif
}

/// `hist[b]` = number of samples `samples[j]` (int, j < n) equal to b, for b < bins; samples
/// outside [0, bins) (`no_bin`) are not counted. Enqueued on `stream`.
template <class SampleIt>
void histogram(void* temp, std::size_t temp_bytes, SampleIt samples, unsigned* hist, int bins,
               std::uint64_t n, cudaStream_t stream) {
  if (n == 0) {
    fill_bytes(hist, 0, sizeof(unsigned) * static_cast<std::size_t>(bins), stream);
    return;
  }
#if GRADCOMP_CUDA_ON_GPU
  std::size_t need = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceHistogram::HistogramEven(
      nullptr, need, samples, hist, bins + 1, 0, bins, static_cast<std::int64_t>(n), stream));
  check_temp(need, temp_bytes, "histogram");
  GRADCOMP_CUDA_CHECK(cub::DeviceHistogram::HistogramEven(
      temp, need, samples, hist, bins + 1, 0, bins, static_cast<std::int64_t>(n), stream));
#else
  (void)temp;
  (void)temp_bytes;
  (void)stream;
  std::fill(hist, hist + bins, 0u);
  for (std::uint64_t j = 0; j < n; ++j) {
    int const s = samples[static_cast<std::ptrdiff_t>(j)];
    if (s >= 0 && s < bins) ++hist[s];
  }
#endif
}

/// Temporary bytes of `select_if` over `n` items.
inline std::size_t select_temp_bytes([[maybe_unused]] std::uint64_t n) {
#if GRADCOMP_CUDA_ON_GPU
  std::size_t bytes = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(nullptr, bytes,
                                            thrust::counting_iterator<std::uint32_t>(0),
                                            static_cast<std::uint32_t*>(nullptr),
                                            static_cast<unsigned long long*>(nullptr),
                                            static_cast<std::int64_t>(n), probe_flag{},
                                            cudaStream_t{}));
  return bytes;
#else
  return 0;
#endif
}

/// Stable compaction: writes the items `in[j]` (32-bit indices, j < n) for which `keep(in[j])`
/// holds to `out`, in their order, and their number to `*d_count`. Enqueued on `stream`.
template <class InIt, class Keep>
void select_if(void* temp, std::size_t temp_bytes, InIt in, std::uint64_t n, Keep keep,
               std::uint32_t* out, unsigned long long* d_count, cudaStream_t stream) {
  if (n == 0) {
    fill_bytes(d_count, 0, sizeof *d_count, stream);
    return;
  }
#if GRADCOMP_CUDA_ON_GPU
  std::size_t need = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(nullptr, need, in, out, d_count,
                                            static_cast<std::int64_t>(n), keep, stream));
  check_temp(need, temp_bytes, "select");
  GRADCOMP_CUDA_CHECK(cub::DeviceSelect::If(temp, need, in, out, d_count,
                                            static_cast<std::int64_t>(n), keep, stream));
#else
  (void)temp;
  (void)temp_bytes;
  (void)stream;
  unsigned long long m = 0;
  for (std::uint64_t j = 0; j < n; ++j) {
    std::uint32_t const v = in[static_cast<std::ptrdiff_t>(j)];
    if (keep(v)) out[m++] = v;
  }
  *d_count = m;
#endif
}

/// Temporary bytes of `inclusive_sum` over `n` 64-bit terms.
inline std::size_t scan_temp_bytes([[maybe_unused]] std::uint64_t n) {
#if GRADCOMP_CUDA_ON_GPU
  std::size_t bytes = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, over_positions(probe_term{}),
                                                    static_cast<std::uint64_t*>(nullptr),
                                                    static_cast<std::int64_t>(n), cudaStream_t{}));
  return bytes;
#else
  return 0;
#endif
}

/// `out[j] = terms[0] + ... + terms[j]` (64-bit, exact), j < n. Enqueued on `stream`.
template <class TermIt>
void inclusive_sum(void* temp, std::size_t temp_bytes, TermIt terms, std::uint64_t* out,
                   std::uint64_t n, cudaStream_t stream) {
  if (n == 0) return;
#if GRADCOMP_CUDA_ON_GPU
  std::size_t need = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, need, terms, out,
                                                    static_cast<std::int64_t>(n), stream));
  check_temp(need, temp_bytes, "scan");
  GRADCOMP_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, need, terms, out,
                                                    static_cast<std::int64_t>(n), stream));
#else
  (void)temp;
  (void)temp_bytes;
  (void)stream;
  std::uint64_t acc = 0;
  for (std::uint64_t j = 0; j < n; ++j) {
    acc += terms[static_cast<std::ptrdiff_t>(j)];
    out[j] = acc;
  }
#endif
}

/// Temporary bytes of `sort_keys` over `n` keys.
inline std::size_t sort_temp_bytes([[maybe_unused]] std::uint64_t n) {
#if GRADCOMP_CUDA_ON_GPU
  std::size_t bytes = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(
      nullptr, bytes, static_cast<std::uint32_t const*>(nullptr),
      static_cast<std::uint32_t*>(nullptr), static_cast<std::int64_t>(n), 0, 32, cudaStream_t{}));
  return bytes;
#else
  return 0;
#endif
}

/// `out[0, n)` = `in[0, n)` sorted ascending (32-bit keys, of which bits [0, bits) may be
/// non-zero). Enqueued on `stream`.
inline void sort_keys(void* temp, std::size_t temp_bytes, std::uint32_t const* in,
                      std::uint32_t* out, std::uint64_t n, int bits, cudaStream_t stream) {
  if (n == 0) return;
#if GRADCOMP_CUDA_ON_GPU
  std::size_t need = 0;
  GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, need, in, out,
                                                     static_cast<std::int64_t>(n), 0, bits, stream));
  check_temp(need, temp_bytes, "sort");
  GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp, need, in, out,
                                                     static_cast<std::int64_t>(n), 0, bits, stream));
#else
  (void)temp;
  (void)temp_bytes;
  (void)stream;
  (void)bits;
  std::copy(in, in + n, out);
  std::sort(out, out + n);
#endif
}

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
