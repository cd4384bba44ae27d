// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Shared harness of gradcomp's benchmark programs: page-aligned, pre-faulted buffers, the
/// Gaussian inputs (fixed seed), one thread pool per thread count, a clock and a median, and the
/// memory baselines the codecs are measured against:
///
/// - `baseline::read`: sum of n floats (what a compressor must at least do: read its input);
/// - `baseline::write`: fill n floats with a constant (what a decompressor must at least do);
/// - `baseline::update`: y += c over n floats (what `decompress_add` must at least do);
/// - `baseline::axpy`: y += x over n floats (what error feedback must at least do: read the
///   gradient and the residual, write the residual);
/// - the traffic kernels `traffic_in` (read n floats, write B bytes per element) and
///   `traffic_out` (read B bytes per element, write n floats), both with streaming stores, the
///   best stores this machine has for an output larger than the caches: they move exactly a
///   codec's bytes and do nothing else, so a codec that reaches them is limited by its traffic
///   alone (`run_traffic`).
///
/// The baselines are vectorised by hand (AVX-512 / AVX2 chosen at run time, like the library's
/// kernels, so the program itself needs no `-m` flags) and run on the same pool with the same
/// chunking (`cpu::for_each_chunk`) as the codecs, so "all threads" means the same for both.

#include <gradcomp/config.hpp>
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <span>
#include <thread>
#include <vector>

#if GRADCOMP_X86_SIMD
#  include <immintrin.h>
#endif

namespace gradcomp_bench {

namespace gc = gradcomp;

/// A heap array of trivially copyable `T`, aligned to 4 KiB and touched once, so that no page
/// fault lands inside a timed region.
template <class T>
class buffer {
 public:
  buffer() = default;
  explicit buffer(std::size_t n) : n_(n) {
    std::size_t const bytes = std::max<std::size_t>(64, (n * sizeof(T) + 4095) / 4096 * 4096);
    data_.reset(static_cast<T*>(std::aligned_alloc(4096, bytes)));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_.get()), 0, bytes);
  }
  [[nodiscard]] T* data() noexcept { return data_.get(); }
  [[nodiscard]] T const* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::span<T> span() noexcept { return {data_.get(), n_}; }
  [[nodiscard]] std::span<T const> span() const noexcept { return {data_.get(), n_}; }

 private:
  struct free_deleter {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<T, free_deleter> data_;
  std::size_t n_ = 0;
};

/// Seed of every benchmark input.
inline constexpr std::uint64_t input_seed = 0x9e3779b97f4a7c15ull;

/// n floats drawn from N(0, 1) with `input_seed`; generated once per n and kept.
inline buffer<float> const& gaussian(std::size_t n) {
  static std::mutex m;
  static std::map<std::size_t, buffer<float>> cache;
  std::lock_guard lock(m);
  auto it = cache.find(n);
  if (it == cache.end()) {
    buffer<float> b(n);
    std::mt19937_64 rng(input_seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) b.data()[i] = dist(rng);
    it = cache.emplace(n, std::move(b)).first;
  }
  return it->second;
}

/// Threads of "all threads" runs: `std::thread::hardware_concurrency()` (at least 1).
inline unsigned all_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

/// A `gradcomp::cpu::thread_pool` of `threads` threads, created once and kept.
inline gc::cpu::thread_pool& pool(unsigned threads) {
  static std::mutex m;
  static std::map<unsigned, std::unique_ptr<gc::cpu::thread_pool>> pools;
  std::lock_guard lock(m);
  auto& p = pools[threads];
  if (!p) p = std::make_unique<gc::cpu::thread_pool>(threads);
  return *p;
}

/// The codec context of a benchmark: fixed seed and step, the pool of `threads`, the library's
/// default parallel threshold (so small tensors stay on one thread, as they would in use).
inline gc::codec_context context(unsigned threads) {
  gc::codec_context ctx;
  ctx.seed = 20261122;
  ctx.step = 3;
  ctx.pool = &pool(threads);
  return ctx;
}

/// Seconds since an arbitrary epoch (steady clock).
inline double now_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Median of `v` (which it reorders); 0 for an empty vector.
inline double median(std::vector<double>& v) {
  if (v.empty()) return 0.0;
  std::size_t const mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double const hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  double const lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lo + hi);
}

// ---------------------------------------------------------------------------------------------
// Memory baselines. Each has a scalar, an AVX2 and an AVX-512 body; four independent
// accumulators (or stores) per iteration keep the loop bound by memory, not by latency.
// ---------------------------------------------------------------------------------------------
namespace kernels {

inline float read_scalar(float const* x, std::size_t n) noexcept {
  float a[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t k = 0; k < 8; ++k) a[k] += x[i + k];
  }
  for (; i < n; ++i) a[0] += x[i];
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

inline void write_scalar(float* y, std::size_t n, float c) noexcept {
  for (std::size_t i = 0; i < n; ++i) y[i] = c;
}

inline void update_scalar(float* y, std::size_t n, float c) noexcept {
  for (std::size_t i = 0; i < n; ++i) y[i] += c;
}

inline void axpy_scalar(float* y, float const* x, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
GRADCOMP_TARGET_AVX512 inline float read_avx512(float const* x, std::size_t n) noexcept {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return s + read_scalar(x + i, n - i);
}

GRADCOMP_TARGET_AVX512 inline void write_avx512(float* y, std::size_t n, float c) noexcept {
  __m512 const v = _mm512_set1_ps(c);
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    _mm512_storeu_ps(y + i, v);
    _mm512_storeu_ps(y + i + 16, v);
    _mm512_storeu_ps(y + i + 32, v);
    _mm512_storeu_ps(y + i + 48, v);
  }
  write_scalar(y + i, n - i, c);
}

GRADCOMP_TARGET_AVX512 inline void update_avx512(float* y, std::size_t n, float c) noexcept {
  __m512 const v = _mm512_set1_ps(c);
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), v));
    _mm512_storeu_ps(y + i + 16, _mm512_add_ps(_mm512_loadu_ps(y + i + 16), v));
    _mm512_storeu_ps(y + i + 32, _mm512_add_ps(_mm512_loadu_ps(y + i + 32), v));
    _mm512_storeu_ps(y + i + 48, _mm512_add_ps(_mm512_loadu_ps(y + i + 48), v));
  }
  update_scalar(y + i, n - i, c);
}

GRADCOMP_TARGET_AVX512 inline void axpy_avx512(float* y, float const* x, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
    _mm512_storeu_ps(y + i + 16, _mm512_add_ps(_mm512_loadu_ps(y + i + 16), _mm512_loadu_ps(x + i + 16)));
  }
  axpy_scalar(y + i, x + i, n - i);
}

GRADCOMP_TARGET_AVX2 inline float read_avx2(float const* x, std::size_t n) noexcept {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float lane[8];
  _mm256_store_ps(lane, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return read_scalar(lane, 8) + read_scalar(x + i, n - i);
}

GRADCOMP_TARGET_AVX2 inline void write_avx2(float* y, std::size_t n, float c) noexcept {
  __m256 const v = _mm256_set1_ps(c);
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm256_storeu_ps(y + i, v);
    _mm256_storeu_ps(y + i + 8, v);
    _mm256_storeu_ps(y + i + 16, v);
    _mm256_storeu_ps(y + i + 24, v);
  }
  write_scalar(y + i, n - i, c);
}

GRADCOMP_TARGET_AVX2 inline void update_avx2(float* y, std::size_t n, float c) noexcept {
  __m256 const v = _mm256_set1_ps(c);
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), v));
    _mm256_storeu_ps(y + i + 8, _mm256_add_ps(_mm256_loadu_ps(y + i + 8), v));
    _mm256_storeu_ps(y + i + 16, _mm256_add_ps(_mm256_loadu_ps(y + i + 16), v));
    _mm256_storeu_ps(y + i + 24, _mm256_add_ps(_mm256_loadu_ps(y + i + 24), v));
  }
  update_scalar(y + i, n - i, c);
}

GRADCOMP_TARGET_AVX2 inline void axpy_avx2(float* y, float const* x, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    _mm256_storeu_ps(y + i + 8, _mm256_add_ps(_mm256_loadu_ps(y + i + 8), _mm256_loadu_ps(x + i + 8)));
  }
  axpy_scalar(y + i, x + i, n - i);
}
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

inline float read(float const* x, std::size_t n, gc::cpu::isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == gc::cpu::isa::avx512) return read_avx512(x, n);
  if (level == gc::cpu::isa::avx2) return read_avx2(x, n);
#endif
  (void)level;
  return read_scalar(x, n);
}

inline void write(float* y, std::size_t n, float c, gc::cpu::isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == gc::cpu::isa::avx512) return write_avx512(y, n, c);
  if (level == gc::cpu::isa::avx2) return write_avx2(y, n, c);
#endif
  (void)level;
  write_scalar(y, n, c);
}

inline void update(float* y, std::size_t n, float c, gc::cpu::isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == gc::cpu::isa::avx512) return update_avx512(y, n, c);
  if (level == gc::cpu::isa::avx2) return update_avx2(y, n, c);
#endif
  (void)level;
  update_scalar(y, n, c);
}

inline void axpy(float* y, float const* x, std::size_t n, gc::cpu::isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == gc::cpu::isa::avx512) return axpy_avx512(y, x, n);
  if (level == gc::cpu::isa::avx2) return axpy_avx2(y, x, n);
#endif
  (void)level;
  axpy_scalar(y, x, n);
}

// Traffic kernels. `lines_out` 64-byte output lines are spread evenly over `lines_in` input
// lines (Bresenham: no division in the loop); each output line holds the running sum of the
// input read so far, so no load is dead. `y` must be 64-byte aligned.
#if GRADCOMP_X86_SIMD
GRADCOMP_SIMD_DIAGNOSTICS_PUSH
GRADCOMP_TARGET_AVX512 inline void traffic_in_avx512(float const* x, std::size_t lines_in,
                                                     std::byte* y, std::size_t lines_out) noexcept {
  __m512 acc = _mm512_setzero_ps();
  std::size_t err = 0, j = 0;
  for (std::size_t i = 0; i < lines_in; ++i) {
    acc = _mm512_add_ps(acc, _mm512_load_ps(x + 16 * i));
    for (err += lines_out; err >= lines_in && j < lines_out; err -= lines_in, ++j) {
      _mm512_stream_ps(reinterpret_cast<float*>(y + 64 * j), acc);
    }
  }
  for (; j < lines_out; ++j) _mm512_stream_ps(reinterpret_cast<float*>(y + 64 * j), acc);
  _mm_sfence();
}

GRADCOMP_TARGET_AVX512 inline void traffic_out_avx512(std::byte const* x, std::size_t lines_in,
                                                      float* y, std::size_t lines_out) noexcept {
  __m512 acc = _mm512_setzero_ps();
  std::size_t err = 0, i = 0;
  for (std::size_t j = 0; j < lines_out; ++j) {
    for (err += lines_in; err >= lines_out && i < lines_in; err -= lines_out, ++i) {
      acc = _mm512_add_ps(acc, _mm512_load_ps(reinterpret_cast<float const*>(x + 64 * i)));
    }
    _mm512_stream_ps(y + 16 * j, acc);
  }
  _mm_sfence();
}

GRADCOMP_TARGET_AVX2 inline void traffic_in_avx2(float const* x, std::size_t lines_in,
                                                 std::byte* y, std::size_t lines_out) noexcept {
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  std::size_t err = 0, j = 0;
  for (std::size_t i = 0; i < lines_in; ++i) {
    a = _mm256_add_ps(a, _mm256_load_ps(x + 16 * i));
    b = _mm256_add_ps(b, _mm256_load_ps(x + 16 * i + 8));
    for (err += lines_out; err >= lines_in && j < lines_out; err -= lines_in, ++j) {
      _mm256_stream_ps(reinterpret_cast<float*>(y + 64 * j), a);
      _mm256_stream_ps(reinterpret_cast<float*>(y + 64 * j + 32), b);
    }
  }
  for (; j < lines_out; ++j) {
    _mm256_stream_ps(reinterpret_cast<float*>(y + 64 * j), a);
    _mm256_stream_ps(reinterpret_cast<float*>(y + 64 * j + 32), b);
  }
  _mm_sfence();
}

GRADCOMP_TARGET_AVX2 inline void traffic_out_avx2(std::byte const* x, std::size_t lines_in,
                                                  float* y, std::size_t lines_out) noexcept {
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  std::size_t err = 0, i = 0;
  for (std::size_t j = 0; j < lines_out; ++j) {
    for (err += lines_in; err >= lines_out && i < lines_in; err -= lines_out, ++i) {
      a = _mm256_add_ps(a, _mm256_load_ps(reinterpret_cast<float const*>(x + 64 * i)));
      b = _mm256_add_ps(b, _mm256_load_ps(reinterpret_cast<float const*>(x + 64 * i + 32)));
    }
    _mm256_stream_ps(y + 16 * j, a);
    _mm256_stream_ps(y + 16 * j + 8, b);
  }
  _mm_sfence();
}
GRADCOMP_SIMD_DIAGNOSTICS_POP
#endif  // GRADCOMP_X86_SIMD

// The portable level has no streaming stores: the same line pattern with ordinary ones.
inline void traffic_in_scalar(float const* x, std::size_t lines_in, std::byte* y,
                              std::size_t lines_out) noexcept {
  float acc[16] = {};
  std::size_t err = 0, j = 0;
  for (std::size_t i = 0; i < lines_in; ++i) {
    for (std::size_t k = 0; k < 16; ++k) acc[k] += x[16 * i + k];
    for (err += lines_out; err >= lines_in && j < lines_out; err -= lines_in, ++j) {
      std::memcpy(y + 64 * j, acc, 64);
    }
  }
  for (; j < lines_out; ++j) std::memcpy(y + 64 * j, acc, 64);
}

inline void traffic_out_scalar(std::byte const* x, std::size_t lines_in, float* y,
                               std::size_t lines_out) noexcept {
  float acc[16] = {};
  std::size_t err = 0, i = 0;
  for (std::size_t j = 0; j < lines_out; ++j) {
    for (err += lines_in; err >= lines_out && i < lines_in; err -= lines_out, ++i) {
      float v[16];
      std::memcpy(v, x + 64 * i, 64);
      for (std::size_t k = 0; k < 16; ++k) acc[k] += v[k];
    }
    std::memcpy(y + 16 * j, acc, 64);
  }
}

/// Reads `lines_in` 64-byte lines of floats at `x`, writes `lines_out` lines at `y`.
inline void traffic_in(float const* x, std::size_t lines_in, std::byte* y, std::size_t lines_out,
                       gc::cpu::isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == gc::cpu::isa::avx512) return traffic_in_avx512(x, lines_in, y, lines_out);
  if (level == gc::cpu::isa::avx2) return traffic_in_avx2(x, lines_in, y, lines_out);
#endif
  (void)level;
  traffic_in_scalar(x, lines_in, y, lines_out);
}

/// Reads `lines_in` 64-byte lines at `x`, writes `lines_out` lines of floats at `y`.
inline void traffic_out(std::byte const* x, std::size_t lines_in, float* y, std::size_t lines_out,
                        gc::cpu::isa level) noexcept {
#if GRADCOMP_X86_SIMD
  if (level == gc::cpu::isa::avx512) return traffic_out_avx512(x, lines_in, y, lines_out);
  if (level == gc::cpu::isa::avx2) return traffic_out_avx2(x, lines_in, y, lines_out);
#endif
  (void)level;
  traffic_out_scalar(x, lines_in, y, lines_out);
}

}  // namespace kernels

/// Which way a traffic kernel moves a codec's bytes.
enum class traffic { in, out };

/// Runs the traffic kernel of a codec whose packet has `bytes` bytes for n floats, on the
/// context's pool and chunking: `in` reads the n floats at `x` and writes `bytes` bytes at
/// `packet` (compression's traffic); `out` reads the bytes at `packet` and writes n floats at
/// `y` (decompression's). The buffers must be 64-byte aligned and n a multiple of 16 (the
/// benchmark sizes are powers of two); every chunk moves its share of whole lines.
inline void run_traffic(traffic dir, float const* x, float* y, std::byte* packet, std::size_t n,
                        std::size_t bytes, gc::codec_context const& ctx) {
  gc::cpu::isa const level = gc::cpu::effective_isa(ctx.isa);
  std::size_t const float_lines = n / 16;
  std::size_t const byte_lines = (bytes + 63) / 64;
  gc::cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t lo, std::size_t hi) {
    std::size_t const f0 = lo / 16, f1 = hi / 16;
    std::size_t const b0 = f0 * byte_lines / float_lines, b1 = f1 * byte_lines / float_lines;
    if (dir == traffic::in) {
      kernels::traffic_in(x + 16 * f0, f1 - f0, packet + 64 * b0, b1 - b0, level);
    } else {
      kernels::traffic_out(packet + 64 * b0, b1 - b0, y + 16 * f0, f1 - f0, level);
    }
  });
}

/// The baselines.
enum class baseline { read, write, update, axpy };

/// Name of a baseline as it appears in benchmark names ("read", "write", "update").
constexpr char const* baseline_name(baseline b) noexcept {
  switch (b) {
    case baseline::read: return "read";
    case baseline::write: return "write";
    case baseline::update: return "update";
    case baseline::axpy: return "axpy";
  }
  return "?";
}

/// Runs baseline `b` over `[0, n)` once, on the context's pool and chunking (16-element
/// alignment, the library's chunk length and parallel threshold). `x` is read by `read` and
/// `axpy`; `y` is written by `write`, `update` and `axpy`. Returns the sum for `read` (0
/// otherwise).
inline float run_baseline(baseline b, float const* x, float* y, std::size_t n,
                          gc::codec_context const& ctx) {
  gc::cpu::isa const level = gc::cpu::effective_isa(ctx.isa);
  if (b != baseline::read) {
    float const c = b == baseline::write ? 0.5f : 1.0e-3f;
    gc::cpu::for_each_chunk(n, 16, ctx, [&](std::size_t, std::size_t lo, std::size_t hi) {
      if (b == baseline::write) {
        kernels::write(y + lo, hi - lo, c, level);
      } else if (b == baseline::axpy) {
        kernels::axpy(y + lo, x + lo, hi - lo, level);
      } else {
        kernels::update(y + lo, hi - lo, c, level);
      }
    });
    return 0.0f;
  }
  // One partial sum per chunk, combined in chunk order (the codecs' own reduction pattern).
  std::vector<float> part(gc::cpu::chunk_count(n, 16));
  gc::cpu::for_each_chunk(n, 16, ctx, [&](std::size_t c, std::size_t lo, std::size_t hi) {
    part[c] = kernels::read(x + lo, hi - lo, level);
  });
  float s = 0.0f;
  for (float p : part) s += p;
  return s;
}

/// The codec configurations bench_codecs.cpp measures, as `make_codec` specs: every element-wise
/// codec, chunk-wise top-k and the DCT-sign codec at their documented settings. The
/// `gradcomp-bench` tool's `--codec all` is this list and the sparsifiers (tools/bench/measure.hpp).
inline constexpr char const* codec_specs[] = {
    "identity",
    "fp16",
    "bf16",
    "int8:bucket=512,rounding=nearest",
    "int8:bucket=512,rounding=stochastic",
    "int4:bucket=64",
    "chunk_topk:chunk=4096,k=64,values=f32",
    "chunk_topk:chunk=4096,k=64,values=int2",
    "dct_sign:chunk=64,k=8",
    "onebit:scaling=mean_abs",
    "onebit:scaling=none",
    "qsgd:levels=7,bucket=512",
    "qsgd:levels=127,bucket=512",
    "terngrad:bucket=512",
    "natural:bucket=512",
    "dithering:levels=2,partition=linear,norm=max,bucket=512",
    "dithering:levels=8,partition=natural,norm=max,bucket=512",
    "dithering:levels=2,partition=linear,norm=l2,bucket=512",
};

}  // namespace gradcomp_bench
