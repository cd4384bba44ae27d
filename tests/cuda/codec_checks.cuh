// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test cases shared by the two CUDA test programs. Each compares the CUDA codecs with the CPU
// codecs byte for byte. Which memory and which Thrust system the CUDA codecs use is decided by
// how the including file is compiled (see gradcomp/cuda/config.cuh):
// - host_backend.cu: Thrust's CPP device system, "device" buffers are host memory;
// - gpu_codecs.cu: the real kernels, device buffers from cudaMalloc.

#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/cuda/fp16.cuh>
#include <gradcomp/cuda/onebit.cuh>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#ifndef GCT_BACKEND
#  error "define GCT_BACKEND (a name for the test cases) before including codec_checks.cuh"
#endif

namespace gc = gradcomp;

namespace gct {

// ---------------------------------------------------------------------------------------------
// Backend memory: device memory on the GPU, host memory under the CPP device system.

template <class T>
class buffer {
 public:
  explicit buffer(std::size_t n) : n_(n) {
#if GRADCOMP_CUDA_ON_GPU
    GRADCOMP_CUDA_CHECK(cudaMalloc(&ptr_, (n == 0 ? 1 : n) * sizeof(T)));
#else
    host_.resize(n == 0 ? 1 : n);
    ptr_ = host_.data();
#endif
  }
  explicit buffer(std::vector<T> const& v) : buffer(v.size()) { upload(v); }
  buffer(buffer const&) = delete;
  buffer& operator=(buffer const&) = delete;
  ~buffer() {
#if GRADCOMP_CUDA_ON_GPU
    (void)cudaFree(ptr_);
#endif
  }

  void upload(std::vector<T> const& v) {
    REQUIRE(v.size() == n_);
    if (n_ == 0) return;
#if GRADCOMP_CUDA_ON_GPU
    GRADCOMP_CUDA_CHECK(cudaMemcpy(ptr_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the data has reached the device, and
    // the codecs may run on a stream that does not wait for the legacy default stream.
    GRADCOMP_CUDA_CHECK(cudaDeviceSynchronize());
#else
    std::memcpy(ptr_, v.data(), n_ * sizeof(T));
#endif
  }
  [[nodiscard]] std::vector<T> download(std::size_t count) const {
    std::vector<T> v(count);
    if (count == 0) return v;
#if GRADCOMP_CUDA_ON_GPU
    GRADCOMP_CUDA_CHECK(cudaDeviceSynchronize());
    GRADCOMP_CUDA_CHECK(cudaMemcpy(v.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
#else
    std::memcpy(v.data(), ptr_, count * sizeof(T));
#endif
    return v;
  }
  [[nodiscard]] std::vector<T> download() const { return download(n_); }
  [[nodiscard]] T* get() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
#if !GRADCOMP_CUDA_ON_GPU
  std::vector<T> host_;
#endif
};

// ---------------------------------------------------------------------------------------------
// Inputs.

inline std::vector<std::size_t> const& sizes() {
  static std::vector<std::size_t> const s = {
      0, 1, 7, 8, 9, 31, 32, 33, 4095, 4096, 4097, 8192 + 5, (std::size_t{1} << 20) + 3};
  return s;
}

inline float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
inline std::uint32_t to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Values on every edge of float -> binary16 rounding.
inline std::vector<float> fp16_specials() {
  float const inf = std::numeric_limits<float>::infinity();
  // clang-format off
  return {
      0.0f, -0.0f, 1.0f, -1.0f,
      65504.0f, -65504.0f,                    // largest finite half
      std::nextafter(65520.0f, 0.0f),         // rounds down to 65504
      65520.0f, -65520.0f,                    // first value that overflows
      1e10f, -1e10f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
      inf, -inf,
      from_bits(0x7fc00000u), from_bits(0xffc00000u),   // quiet NaNs
      from_bits(0x7f800001u), from_bits(0xff800001u),   // signalling NaNs
      from_bits(0x7fabcdefu), from_bits(0x7f802000u),   // NaN payloads (kept / truncated)
      std::numeric_limits<float>::denorm_min(), -1e-40f,  // float subnormals -> 0
      6.103515625e-05f,                                 // 2^-14, smallest normal half
      std::nextafter(6.103515625e-05f, 0.0f),           // rounds up into the normals
      5.9604644775390625e-08f,                          // 2^-24, smallest subnormal half
      2.98023223876953125e-08f,                         // 2^-25: tie, rounds to 0
      -2.98023223876953125e-08f,
      4.470348358154297e-08f,                           // 1.5 * 2^-25: rounds to 2^-24
      1e-5f, -3e-6f,                                    // half subnormals
      1.0f + 0.00048828125f,                            // 1 + 2^-11: tie, to even (1)
      1.0f + 3 * 0.00048828125f,                        // tie, to even (up)
      2049.0f, 2051.0f, -4098.0f,                       // ties at spacings 2 and 4
  };
  // clang-format on
}

// Normal values spread over many binades, with `specials` planted at the ends and at
// pseudo-random positions.
inline std::vector<float> make_input(std::size_t n, std::uint64_t seed,
                                     std::vector<float> const& specials = {}) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-8.0f, 8.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng) * std::pow(10.0f, expo(rng));
  if (n == 0 || specials.empty()) return x;
  for (std::size_t k = 0; k < specials.size() && k < n; ++k) {
    x[k] = specials[k];
    x[n - 1 - k] = specials[specials.size() - 1 - k];
  }
  std::uniform_int_distribution<std::size_t> pos(0, n - 1);
  for (std::size_t k = 0; k < 4 * specials.size(); ++k) x[pos(rng)] = specials[k % specials.size()];
  return x;
}

// Uniformly random bit patterns: every float class, including NaNs with random payloads.
inline std::vector<float> random_bits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = from_bits(static_cast<std::uint32_t>(rng()));
  return x;
}

// ---------------------------------------------------------------------------------------------
// Running the CPU and CUDA codecs.

template <class CpuCodec>
std::vector<std::byte> cpu_compress(CpuCodec const& c, std::vector<float> const& x) {
  std::vector<std::byte> out(c.max_compressed_bytes(x.size()));
  std::size_t const size = c.compress(std::span<float const>(x), std::span<std::byte>(out));
  out.resize(size);
  return out;
}

template <class CudaCodec>
std::vector<std::byte> cuda_compress(CudaCodec const& c, std::vector<float> const& x,
                                     cudaStream_t stream = nullptr) {
  buffer<float> const in(x);
  buffer<std::byte> out(c.max_compressed_bytes(x.size()));
  std::size_t const size = c.compress(in.get(), x.size(), out.get(), stream);
  REQUIRE(size == c.max_compressed_bytes(x.size()));
  return out.download(size);
}

// Decoded output of the CPU codec: out = x̂, or out = init + alpha x̂ when `add`.
template <class CpuCodec>
std::vector<float> cpu_decode(CpuCodec const& c, std::vector<std::byte> const& packet,
                              std::vector<float> out, bool add, float alpha) {
  std::span<std::byte const> const p(packet);
  if (add) {
    c.decompress_add(p, std::span<float>(out), alpha);
  } else {
    c.decompress(p, std::span<float>(out));
  }
  return out;
}

template <class CudaCodec>
std::vector<float> cuda_decode(CudaCodec const& c, std::vector<std::byte> const& packet,
                               std::vector<float> const& init, bool add, float alpha) {
  buffer<std::byte> const p(packet);
  buffer<float> out(init);
  if (add) {
    c.decompress_add(p.get(), packet.size(), out.get(), init.size(), alpha);
  } else {
    c.decompress(p.get(), packet.size(), out.get(), init.size());
  }
  return out.download();
}

// Bitwise equality, except that any NaN equals any NaN (the CPU and the GPU may give different
// NaN bits for fma with a NaN operand; that is the one place their results may differ).
inline bool same_floats(std::vector<float> const& a, std::vector<float> const& b,
                        bool nan_bits_matter) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (to_bits(a[i]) == to_bits(b[i])) continue;
    if (!nan_bits_matter && std::isnan(a[i]) && std::isnan(b[i])) continue;
    UNSCOPED_INFO("element " << i << ": " << a[i] << " (0x" << std::hex << to_bits(a[i]) << ") vs "
                             << b[i] << " (0x" << to_bits(b[i]) << std::dec << ")");
    return false;
  }
  return true;
}

inline std::size_t first_difference(std::vector<std::byte> const& a,
                                    std::vector<std::byte> const& b) {
  std::size_t const m = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < m; ++i) {
    if (a[i] != b[i]) return i;
  }
  return m;
}

// Packets are compared by size and first differing byte (printing whole packets would bury
// the failure).
#define GCT_REQUIRE_SAME_PACKET(cpu, gpu)                                  \
  do {                                                                     \
    auto const& gct_cpu_ = (cpu);                                          \
    auto const& gct_gpu_ = (gpu);                                          \
    REQUIRE(gct_cpu_.size() == gct_gpu_.size());                           \
    REQUIRE(gct::first_difference(gct_cpu_, gct_gpu_) == gct_cpu_.size()); \
  } while (0)

// The exception a decode call throws, as "kind: message" ("none" if it does not throw).
template <class Fn>
std::string thrown_by(Fn&& fn) {
  try {
    fn();
  } catch (gc::format_error const& e) {
    return std::string("format_error: ") + e.what();
  } catch (gc::config_error const& e) {
    return std::string("config_error: ") + e.what();
  } catch (gc::numeric_error const& e) {
    return std::string("numeric_error: ") + e.what();
  } catch (gc::error const& e) {
    return std::string("error: ") + e.what();
  }
  return "none";
}

// A malformed packet must be rejected by the CUDA codec exactly as by the CPU codec (same
// exception type and message), by decompress and decompress_add, without touching the output.
template <class CpuCodec, class CudaCodec>
void require_same_rejection(CpuCodec const& cpu, CudaCodec const& gpu,
                            std::vector<std::byte> const& packet, std::size_t n) {
  std::vector<float> const init(n, 42.0f);
  std::string const expected = thrown_by([&] { (void)cpu_decode(cpu, packet, init, false, 1.0f); });
  INFO("CPU codec: " << expected);
  REQUIRE(expected != "none");
  REQUIRE(expected.rfind("error: ", 0) != 0);  // a specific gradcomp error, not a CUDA failure

  buffer<std::byte> const p(packet);
  buffer<float> out(init);
  CHECK(thrown_by([&] { gpu.decompress(p.get(), packet.size(), out.get(), n); }) == expected);
  CHECK(thrown_by([&] { gpu.decompress_add(p.get(), packet.size(), out.get(), n, 0.5f); }) ==
        expected);
  CHECK(out.download() == init);
}

inline void put_u32(std::vector<std::byte>& p, std::size_t at, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) p[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xffu);
}
inline void put_u64(std::vector<std::byte>& p, std::size_t at, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) p[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xffu);
}

// Mutations every codec must reject: header-level damage.
template <class CpuCodec, class CudaCodec>
void check_header_rejections(CpuCodec const& cpu, CudaCodec const& gpu,
                             std::vector<std::byte> const& good, std::size_t n) {
  auto mutated = [&](auto&& edit) {
    std::vector<std::byte> p = good;
    edit(p);
    return p;
  };
  SECTION("truncated packets") {
    for (std::size_t len :
         {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{32}, good.size() - 1}) {
      INFO("length " << len);
      require_same_rejection(cpu, gpu, std::vector<std::byte>(good.begin(), good.begin() + len), n);
    }
  }
  SECTION("trailing garbage") {
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p.push_back(std::byte{0}); }), n);
  }
  SECTION("magic, version, codec, dtype") {
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p[0] = std::byte{'X'}; }), n);
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p[3] = std::byte{0}; }), n);
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p[4] = std::byte{gc::wire_version + 1}; }), n);
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p[4] = std::byte{0}; }), n);
    for (std::uint8_t id : {1, 2, 3, 4, 5, 6, 200}) {
      if (id == static_cast<std::uint8_t>(CudaCodec::id)) continue;
      require_same_rejection(cpu, gpu, mutated([&](auto& p) { p[5] = std::byte{id}; }), n);
    }
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p[6] = std::byte{0}; }), n);
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p[6] = std::byte{9}; }), n);
  }
  SECTION("variant and parameters") {
    require_same_rejection(cpu, gpu, mutated([](auto& p) { p[7] = std::byte{7}; }), n);
    require_same_rejection(cpu, gpu, mutated([](auto& p) { put_u32(p, 24, 1); }), n);
    require_same_rejection(cpu, gpu, mutated([](auto& p) { put_u32(p, 28, 0x80000000u); }), n);
  }
  SECTION("counts and sizes") {
    // Declared payload disagrees with the buffer.
    require_same_rejection(cpu, gpu,
                           mutated([&](auto& p) { put_u64(p, 16, good.size() - 32 + 2); }), n);
    // Count disagrees with the payload.
    require_same_rejection(cpu, gpu, mutated([&](auto& p) { put_u64(p, 8, n + 64); }), n);
    // Impossible count.
    require_same_rejection(cpu, gpu, mutated([](auto& p) { put_u64(p, 8, ~std::uint64_t{0}); }), n);
    // A valid packet of a different size: a config_error, not a format_error.
    std::vector<float> const other = make_input(n + 8, 99);
    require_same_rejection(cpu, gpu, cpu_compress(cpu, other), n);
  }
}

}  // namespace gct

// =============================================================================================
// fp16

TEST_CASE(GCT_BACKEND ": fp16 packets are byte-identical to the CPU codec", "[cuda][fp16]") {
  gc::fp16_codec const cpu;
  gc::cuda::fp16_codec const gpu;
  std::vector<float> const specials = gct::fp16_specials();
  for (std::size_t n : gct::sizes()) {
    INFO("n = " << n);
    CHECK(gpu.max_compressed_bytes(n) == cpu.max_compressed_bytes(n));
    std::vector<float> const x = gct::make_input(n, 1000 + n, specials);
    GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, x), gct::cuda_compress(gpu, x));
    std::vector<float> const r = gct::random_bits(n, 2000 + n);
    GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, r), gct::cuda_compress(gpu, r));
  }
}

TEST_CASE(GCT_BACKEND ": fp16 decoding matches the CPU codec", "[cuda][fp16]") {
  gc::fp16_codec const cpu;
  gc::cuda::fp16_codec const gpu;
  for (std::size_t n : gct::sizes()) {
    INFO("n = " << n);
    std::vector<float> const x = gct::make_input(n, 3000 + n, gct::fp16_specials());
    std::vector<std::byte> const packet = gct::cpu_compress(cpu, x);
    std::vector<float> const init = gct::make_input(n, 4000 + n);
    std::vector<float> const zero(n, 0.0f);
    CHECK(gct::same_floats(gct::cpu_decode(cpu, packet, zero, false, 1.0f),
                           gct::cuda_decode(gpu, packet, zero, false, 1.0f), true));
    for (float alpha : {1.0f, 0.75f, -3.0f}) {
      INFO("alpha = " << alpha);
      CHECK(gct::same_floats(gct::cpu_decode(cpu, packet, init, true, alpha),
                             gct::cuda_decode(gpu, packet, init, true, alpha), false));
    }
  }
}

TEST_CASE(GCT_BACKEND ": fp16 decodes every binary16 bit pattern like the CPU codec",
          "[cuda][fp16]") {
  gc::fp16_codec const cpu;
  gc::cuda::fp16_codec const gpu;
  std::size_t const n = 65536;
  std::vector<std::byte> packet = gct::cpu_compress(cpu, std::vector<float>(n, 0.0f));
  for (std::size_t i = 0; i < n; ++i) {
    packet[32 + 2 * i] = static_cast<std::byte>(i & 0xffu);
    packet[32 + 2 * i + 1] = static_cast<std::byte>(i >> 8);
  }
  std::vector<float> const zero(n, 0.0f);
  CHECK(gct::same_floats(gct::cpu_decode(cpu, packet, zero, false, 1.0f),
                         gct::cuda_decode(gpu, packet, zero, false, 1.0f), true));
  std::vector<float> const init = gct::make_input(n, 5);
  CHECK(gct::same_floats(gct::cpu_decode(cpu, packet, init, true, -0.5f),
                         gct::cuda_decode(gpu, packet, init, true, -0.5f), false));
}

TEST_CASE(GCT_BACKEND ": fp16 decodes packets of 16-bit inputs from the CPU codec",
          "[cuda][fp16]") {
  gc::fp16_codec const cpu;
  gc::cuda::fp16_codec const gpu;
  std::size_t const n = 4097;
  std::vector<float> const x = gct::make_input(n, 6, gct::fp16_specials());
  std::vector<gc::half> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = gc::half(x[i]);
  std::vector<std::byte> packet(cpu.max_compressed_bytes(n));
  packet.resize(cpu.compress(std::span<gc::half const>(h), std::span<std::byte>(packet)));
  std::vector<float> const zero(n, 0.0f);
  CHECK(gct::same_floats(gct::cpu_decode(cpu, packet, zero, false, 1.0f),
                         gct::cuda_decode(gpu, packet, zero, false, 1.0f), true));
}

TEST_CASE(GCT_BACKEND ": fp16 rejects malformed packets like the CPU codec", "[cuda][fp16]") {
  gc::fp16_codec const cpu;
  gc::cuda::fp16_codec const gpu;
  std::size_t const n = 100;
  std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(n, 7));
  gct::check_header_rejections(cpu, gpu, good, n);
}

// =============================================================================================
// onebit

namespace gct {

// Magnitudes over many binades, so that the double sum's rounding depends on its order; plus
// signed zeros, subnormals and huge finite values.
inline std::vector<float> onebit_specials() {
  return {0.0f,
          -0.0f,
          -1e-40f,
          std::numeric_limits<float>::denorm_min(),
          -std::numeric_limits<float>::max(),
          3e38f,
          -1e-30f,
          1e30f,
          -7.0f};
}

}  // namespace gct

TEST_CASE(GCT_BACKEND ": onebit packets are byte-identical to the CPU codec", "[cuda][onebit]") {
  using scaling = gc::onebit_codec::scaling;
  for (scaling mode : {scaling::mean_abs, scaling::none}) {
    gc::onebit_codec const cpu(mode);
    gc::cuda::onebit_codec const gpu(mode);
    REQUIRE(gpu.scale_mode() == mode);
    for (std::size_t n : gct::sizes()) {
      INFO("mode " << static_cast<int>(mode) << ", n = " << n);
      CHECK(gpu.max_compressed_bytes(n) == cpu.max_compressed_bytes(n));
      std::vector<float> const x = gct::make_input(n, 7000 + n);
      GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, x), gct::cuda_compress(gpu, x));
      std::vector<float> const s = gct::make_input(n, 8000 + n, gct::onebit_specials());
      GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, s), gct::cuda_compress(gpu, s));
    }
    // All negative, all positive, all zero (every bit set / clear, scale of zero), and tiny
    // values whose mean is a float subnormal.
    for (float v : {-2.5f, 0.125f, 0.0f, -0.0f, -1e-40f, 3e-45f}) {
      std::vector<float> const c(4097, v);
      GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, c), gct::cuda_compress(gpu, c));
    }
    std::vector<float> mixed = gct::make_input(8192 + 3, 17);
    for (float& v : mixed) v *= 1e-44f;  // mostly subnormal and zero elements
    GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, mixed), gct::cuda_compress(gpu, mixed));
  }
}

namespace gct {

// The scale mean|x| rounds a double total to float, which hides almost every difference in the
// order of the double additions. These inputs are built so that it does not: the exact total
// is a float rounding tie (times n, a power of two), and where small terms are added decides
// whether they are absorbed by rounding. Each input comes with an order it tells apart from
// the canonical one (onebit_sum_order); the test checks that it really does.
struct order_trap {
  char const* name;
  std::vector<float> x;
  double (*other_total)(std::vector<float> const&);
};

inline double canonical_total(std::vector<float> const& x, bool reverse_lanes,
                              bool reverse_blocks) {
  std::size_t const n = x.size();
  std::vector<double> block_sums;
  for (std::size_t b = 0; b < n; b += 4096) {
    double lane[16] = {};
    for (std::size_t i = b; i < n && i < b + 4096; ++i) lane[i % 16] += std::fabs(double(x[i]));
    double s = 0.0;
    for (int l = 0; l < 16; ++l) s += lane[reverse_lanes ? 15 - l : l];
    block_sums.push_back(s);
  }
  double t = 0.0;
  for (std::size_t k = 0; k < block_sums.size(); ++k) {
    t += block_sums[reverse_blocks ? block_sums.size() - 1 - k : k];
  }
  return t;
}

inline double pairwise(float const* x, std::size_t n) {
  if (n == 1) return std::fabs(double(x[0]));
  return pairwise(x, n / 2) + pairwise(x + n / 2, n - n / 2);
}

inline std::vector<order_trap> order_traps() {
  std::size_t const n = 16384;                    // 4 blocks; a power of two, so total / n is exact
  float const big = 16777216.0f;                  // 2^24: double ulp 2^-28 above it
  float const tiny = 9.313225746154785e-10f;      // 2^-30: absorbed when added to 2^24
  float const half_ulp = 1.862645149230957e-09f;  // 2^-29: a tie when added to 2^24 + 1
  std::vector<order_trap> traps;
  {  // small terms behind the big one in lane 0: lost canonically, kept by a tree
    std::vector<float> x(n, 0.0f);
    x[0] = big;
    x[1] = 1.0f;
    for (std::size_t j = 1; j < 256; ++j) x[16 * j] = tiny;
    traps.push_back({"pairwise tree", x,
                     [](std::vector<float> const& v) { return pairwise(v.data(), v.size()); }});
  }
  {  // small terms in their own lanes: kept canonically, lost by one running sum
    std::vector<float> x(n, 0.0f);
    x[0] = big;
    x[1] = 1.0f;
    for (std::size_t i = 0; i < 4096; ++i) {
      if (i % 16 >= 2) x[i] = tiny;
    }
    traps.push_back({"sequential", x, [](std::vector<float> const& v) {
                       double t = 0.0;
                       for (float f : v) t += std::fabs(double(f));
                       return t;
                     }});
  }
  {  // two half-ulp block sums after the big block: each a tie (kept even), but not together
    std::vector<float> x(n, 0.0f);
    x[0] = big;
    x[1] = 1.0f;
    x[4096] = half_ulp;
    x[8192] = -half_ulp;
    traps.push_back({"reversed blocks", x,
                     [](std::vector<float> const& v) { return canonical_total(v, false, true); }});
  }
  {  // the same within a block: lane 0 holds 2^24 + 1, lanes 1 and 2 half an ulp each
    std::vector<float> x(n, 0.0f);
    x[0] = big;
    x[16] = 1.0f;
    x[1] = half_ulp;
    x[2] = -half_ulp;
    traps.push_back({"reversed lanes", x,
                     [](std::vector<float> const& v) { return canonical_total(v, true, false); }});
  }
  return traps;
}

}  // namespace gct

TEST_CASE(GCT_BACKEND ": onebit scale follows the canonical summation order", "[cuda][onebit]") {
  gc::onebit_codec const cpu;
  gc::cuda::onebit_codec const gpu;
  for (gct::order_trap const& t : gct::order_traps()) {
    INFO("input that tells the canonical order from: " << t.name);
    std::vector<std::byte> const expected = gct::cpu_compress(cpu, t.x);
    float const scale =
        std::bit_cast<float>(gc::detail::load_le<std::uint32_t>(expected.data() + 32));
    double const n = static_cast<double>(t.x.size());
    REQUIRE(scale == static_cast<float>(gct::canonical_total(t.x, false, false) / n));
    REQUIRE(scale != static_cast<float>(t.other_total(t.x) / n));
    GCT_REQUIRE_SAME_PACKET(expected, gct::cuda_compress(gpu, t.x));
  }
}

TEST_CASE(GCT_BACKEND ": onebit decoding matches the CPU codec", "[cuda][onebit]") {
  using scaling = gc::onebit_codec::scaling;
  for (scaling mode : {scaling::mean_abs, scaling::none}) {
    gc::onebit_codec const cpu(mode);
    gc::cuda::onebit_codec const gpu(mode);
    for (std::size_t n : gct::sizes()) {
      INFO("mode " << static_cast<int>(mode) << ", n = " << n);
      std::vector<float> const x = gct::make_input(n, 9000 + n, gct::onebit_specials());
      std::vector<std::byte> const packet = gct::cpu_compress(cpu, x);
      std::vector<float> const init = gct::make_input(n, 10000 + n);
      CHECK(gct::same_floats(gct::cpu_decode(cpu, packet, init, false, 1.0f),
                             gct::cuda_decode(gpu, packet, init, false, 1.0f), true));
      for (float alpha : {1.0f, 0.25f, -1.5f}) {
        INFO("alpha = " << alpha);
        CHECK(gct::same_floats(gct::cpu_decode(cpu, packet, init, true, alpha),
                               gct::cuda_decode(gpu, packet, init, true, alpha), true));
      }
    }
  }
}

TEST_CASE(GCT_BACKEND ": onebit rejects non-finite inputs like the CPU codec", "[cuda][onebit]") {
  using scaling = gc::onebit_codec::scaling;
  float const inf = std::numeric_limits<float>::infinity();
  float const nan = std::numeric_limits<float>::quiet_NaN();
  struct plant {
    std::size_t n, at;
    float v;
  };
  for (scaling mode : {scaling::mean_abs, scaling::none}) {
    gc::onebit_codec const cpu(mode);
    gc::cuda::onebit_codec const gpu(mode);
    for (plant const p : {plant{1, 0, nan}, plant{4097, 0, inf}, plant{4097, 4096, -inf},
                          plant{8192 + 5, 5000, -nan}, plant{100, 50, nan}}) {
      INFO("n = " << p.n << ", at " << p.at);
      std::vector<float> x = gct::make_input(p.n, 11);
      x[p.at] = p.v;
      if (p.at + 7 < p.n) x[p.at + 7] = inf;  // only the first one is reported
      std::string const expected = gct::thrown_by([&] { (void)gct::cpu_compress(cpu, x); });
      REQUIRE(expected.rfind("numeric_error: ", 0) == 0);
      CHECK(gct::thrown_by([&] { (void)gct::cuda_compress(gpu, x); }) == expected);
    }
  }
}

TEST_CASE(GCT_BACKEND ": onebit two-phase workspace", "[cuda][onebit]") {
  gc::onebit_codec const cpu;
  gc::cuda::onebit_codec const gpu;
  std::size_t const n = 3 * 4096 + 17;
  std::vector<float> const x = gct::make_input(n, 12);
  gct::buffer<float> const in(x);
  gct::buffer<std::byte> out(gpu.max_compressed_bytes(n));

  std::size_t temp_bytes = 0;
  CHECK(gpu.compress(nullptr, temp_bytes, in.get(), n, out.get()) == 0);
  CHECK(temp_bytes == gc::cuda::onebit_codec::workspace_bytes(n));

  // A misaligned scratch pointer is fine as long as the size is what was asked for.
  gct::buffer<std::byte> temp(temp_bytes + 1);
  std::size_t const size = gpu.compress(temp.get() + 1, temp_bytes, in.get(), n, out.get());
  GCT_REQUIRE_SAME_PACKET(gct::cpu_compress(cpu, x), out.download(size));

  std::size_t small = temp_bytes - 1;
  CHECK(gct::thrown_by([&] {
          (void)gpu.compress(temp.get(), small, in.get(), n, out.get());
        }).rfind("config_error: ", 0) == 0);
}

TEST_CASE(GCT_BACKEND ": onebit rejects malformed packets like the CPU codec", "[cuda][onebit]") {
  using scaling = gc::onebit_codec::scaling;
  gc::onebit_codec const cpu;
  gc::cuda::onebit_codec const gpu;
  std::size_t const n = 100;  // 12.5 bytes of signs: 4 padding bits
  std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(n, 13));

  SECTION("header") { gct::check_header_rejections(cpu, gpu, good, n); }

  SECTION("payload") {
    auto with = [&](auto&& edit) {
      std::vector<std::byte> p = good;
      edit(p);
      return p;
    };
    for (std::uint32_t bad_scale : {0x7fc00000u, 0x7f800000u, 0xff800000u, 0xbf800000u, 0x80000000u}) {
      INFO("scale bits 0x" << std::hex << bad_scale);
      gct::require_same_rejection(cpu, gpu, with([&](auto& p) { gct::put_u32(p, 32, bad_scale); }),
                                  n);
    }
    // An unscaled packet must carry scale 1.
    gct::require_same_rejection(cpu, gpu, with([](auto& p) { p[7] = std::byte{1}; }), n);
    gct::require_same_rejection(cpu, gpu, with([](auto& p) { gct::put_u32(p, 36, 1); }), n);
    gct::require_same_rejection(cpu, gpu, with([](auto& p) { gct::put_u32(p, 36, 0x80000000u); }),
                                n);
    for (unsigned bit = 4; bit < 8; ++bit) {
      INFO("padding bit " << bit);
      gct::require_same_rejection(
          cpu, gpu, with([&](auto& p) { p.back() |= static_cast<std::byte>(1u << bit); }), n);
    }
  }

  SECTION("accepted oddities decode like the CPU codec") {
    // A full last byte (n % 8 == 0) is valid. (A -0 scale is rejected: see "payload".)
    gc::onebit_codec const cpu_none(scaling::none);
    gc::cuda::onebit_codec const gpu_none(scaling::none);
    std::vector<std::byte> const full = gct::cpu_compress(cpu_none, gct::make_input(96, 14));
    std::vector<float> const init96(96, 1.0f);
    CHECK(gct::same_floats(gct::cpu_decode(cpu_none, full, init96, true, 2.0f),
                           gct::cuda_decode(gpu_none, full, init96, true, 2.0f), true));
  }
}
