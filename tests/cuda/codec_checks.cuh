// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test cases shared by the two CUDA test programs. Each runs a CUDA codec and the CPU codec of
// the same format live, side by side, and requires byte-identical packets, bit-identical
// decoded tensors and residuals, and the same exceptions with the same messages. Stochastic
// codecs are compared at several (seed, step, tensor) keys, never against stored bytes, so the
// comparison follows any change of the CPU generator (core/philox.hpp); the golden packets of
// the CPU suite (tests/unit/support/golden_packets.hpp) are checked as well. Which memory and
// which Thrust system the CUDA codecs use is decided by how the including file is compiled
// (see gradcomp/cuda/config.cuh):
// - host_backend.cu: Thrust's CPP device system, "device" buffers are host memory;
// - gpu_codecs.cu: the real kernels, device buffers from cudaMalloc.

#include <gradcomp/codec/approx_topk.hpp>
#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/chunk_topk.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/int4.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/natural.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/codec/threshold.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/cuda/cast.cuh>
#include <gradcomp/cuda/chunk_topk.cuh>
#include <gradcomp/cuda/dithering.cuh>
#include <gradcomp/cuda/int4.cuh>
#include <gradcomp/cuda/int8.cuh>
#include <gradcomp/cuda/natural.cuh>
#include <gradcomp/cuda/onebit.cuh>
#include <gradcomp/cuda/randomk.cuh>
#include <gradcomp/cuda/threshold.cuh>
#include <gradcomp/cuda/topk.cuh>
#include <gradcomp/feedback/policies.hpp>

#include <catch2/catch.hpp>

#include "../unit/support/golden_packets.hpp"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <string_view>
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

inline float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
inline std::uint32_t to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

inline std::vector<std::size_t> const& sizes() {
  static std::vector<std::size_t> const s = {0,
                                             1,
                                             7,
                                             15,
                                             16,
                                             17,
                                             127,
                                             128,
                                             129,
                                             511,
                                             512,
                                             513,
                                             4095,
                                             4096,
                                             4097,
                                             8192 + 5,
                                             (std::size_t{1} << 20) + 3};
  return s;
}

// The sizes without the largest, for the checks that run many configurations.
inline std::vector<std::size_t> const& small_sizes() {
  static std::vector<std::size_t> const s(sizes().begin(), sizes().end() - 1);
  return s;
}

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

// Finite values every quantizer accepts, on its edges: signed zeros, float subnormals, tiny and
// large magnitudes, exact ties of the rounding steps.
inline std::vector<float> finite_specials() {
  return {0.0f,    -0.0f,    std::numeric_limits<float>::denorm_min(),
          -1e-40f, 1e-30f,   -1e-30f,
          1e30f,   -1e30f,   0.5f,
          -0.5f,   1.0f,     -1.0f,
          3e-39f,  65504.0f, -2.5f};
}

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

// ---------------------------------------------------------------------------------------------
// Element types.

template <gc::element T>
std::uint32_t bits_of(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return to_bits(v);
  } else {
    return v.bits;
  }
}

// `x` rounded to `T`. With `saturate`, a finite value beyond T's range becomes T's largest
// finite value of its sign instead of an infinity (inputs a quantizer must accept).
template <gc::element T>
std::vector<T> convert(std::vector<float> const& x, bool saturate = false) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    out[i] = gc::from_float<T>(x[i]);
    if constexpr (!std::is_same_v<T, float>) {
      if (saturate && std::isinf(gc::to_float(out[i])) && std::isfinite(x[i])) {
        std::uint32_t const largest = std::is_same_v<T, gc::half> ? 0x7bffu : 0x7f7fu;
        out[i] = T::from_bits(static_cast<std::uint16_t>(largest | (x[i] < 0 ? 0x8000u : 0u)));
      }
    }
  }
  return out;
}

// Runs `fn` with a value of each gradient element type (float, half, bfloat16).
template <class Fn>
void for_each_element_type(Fn&& fn) {
  fn(float{});
  fn(gc::half{});
  fn(gc::bfloat16{});
}

template <gc::element T>
char const* type_name() {
  return gc::dtype_name(gc::dtype_of<T>).data();
}

// ---------------------------------------------------------------------------------------------
// Running the CPU and CUDA codecs. Randomness is keyed by a `random_stream`: on the CPU its
// seed and step go into the context and its tensor into the tensor view.

// A context that runs the CPU codec on the calling thread (errors then name the first bad
// element or bucket, as the CUDA codecs do).
inline gc::codec_context cpu_context(gc::random_stream const& rs = {}) {
  gc::codec_context ctx;
  ctx.seed = rs.seed;
  ctx.step = rs.step;
  ctx.parallel_threshold = std::numeric_limits<std::size_t>::max();
  return ctx;
}

template <class CpuCodec, gc::element T>
std::vector<std::byte> cpu_compress(CpuCodec const& c, std::vector<T> const& x,
                                    gc::random_stream const& rs = {}) {
  std::vector<std::byte> out(c.max_compressed_bytes(x.size()));
  gc::tensor_view<T const> const in(std::span<T const>(x), static_cast<gc::tensor_id>(rs.tensor));
  std::size_t const size = c.compress(in, std::span<std::byte>(out), cpu_context(rs));
  out.resize(size);
  return out;
}

// The two-phase form: the workspace is queried, then given (at an odd address).
template <class CudaCodec, gc::element T>
std::vector<std::byte> cuda_compress(CudaCodec const& c, std::vector<T> const& x,
                                     gc::random_stream const& rs = {},
                                     cudaStream_t stream = nullptr) {
  buffer<T> const in(x);
  buffer<std::byte> out(c.max_compressed_bytes(x.size()));
  std::size_t temp_bytes = 0;
  REQUIRE(c.compress(nullptr, temp_bytes, in.get(), x.size(), out.get(), stream, rs) == 0);
  REQUIRE(temp_bytes == c.workspace_bytes(x.size()));
  buffer<std::byte> temp(temp_bytes + 1);
  std::size_t const size =
      c.compress(temp.get() + 1, temp_bytes, in.get(), x.size(), out.get(), stream, rs);
  return out.download(size);
}

// Decoded output of the CPU codec: out = x̂, or out = init + alpha x̂ when `add`.
// `rs`: the seed and step of the decoder's context (random-k regenerates its coordinates from
// them; the other codecs ignore them).
template <class CpuCodec, gc::element T>
std::vector<T> cpu_decode(CpuCodec const& c, std::vector<std::byte> const& packet,
                          std::vector<T> out, bool add, float alpha,
                          gc::random_stream const& rs = {}) {
  std::span<std::byte const> const p(packet);
  if (add) {
    c.decompress_add(p, std::span<T>(out), alpha, cpu_context(rs));
  } else {
    c.decompress(p, std::span<T>(out), cpu_context(rs));
  }
  return out;
}

// The CUDA sparsifiers' decoders take the decoder's stream (`rs`) as their last argument.
template <class CudaCodec, gc::element T>
std::vector<T> cuda_decode(CudaCodec const& c, std::vector<std::byte> const& packet,
                           std::vector<T> const& init, bool add, float alpha,
                           gc::random_stream const& rs = {}) {
  buffer<std::byte> const p(packet);
  buffer<T> out(init);
  constexpr bool keyed = requires { c.decompress(p.get(), packet.size(), out.get(), init.size(),
                                                 cudaStream_t{}, rs); };
  if constexpr (keyed) {
    if (add) {
      c.decompress_add(p.get(), packet.size(), out.get(), init.size(), alpha, nullptr, rs);
    } else {
      c.decompress(p.get(), packet.size(), out.get(), init.size(), nullptr, rs);
    }
  } else {
    if (add) {
      c.decompress_add(p.get(), packet.size(), out.get(), init.size(), alpha);
    } else {
      c.decompress(p.get(), packet.size(), out.get(), init.size());
    }
  }
  return out.download();
}

// Bitwise equality, except that any NaN equals any NaN when `nan_bits_matter` is false (the
// CPU and the GPU may give different NaN bits for fma with a NaN operand; that is the one
// place their results may differ).
template <gc::element T>
bool same_elements(std::vector<T> const& a, std::vector<T> const& b, bool nan_bits_matter) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (bits_of(a[i]) == bits_of(b[i])) continue;
    float const fa = gc::to_float(a[i]), fb = gc::to_float(b[i]);
    if (!nan_bits_matter && std::isnan(fa) && std::isnan(fb)) continue;
    UNSCOPED_INFO("element " << i << ": " << fa << " (0x" << std::hex << bits_of(a[i]) << ") vs "
                             << fb << " (0x" << bits_of(b[i]) << std::dec << ")");
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

// The exception a call throws, as "kind: message" ("none" if it does not throw).
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

// ---------------------------------------------------------------------------------------------
// The properties every pair (CPU codec, CUDA codec) must have.

// Keys at which stochastic codecs are compared.
inline std::vector<gc::random_stream> const& keys() {
  static std::vector<gc::random_stream> const k = {
      {0, 0, 0}, {0x0123456789abcdefull, 7, 3}, {0xfeedfacecafebeefull, 123456, 0xabcdef01u}};
  return k;
}

// Packets of `x` (as float, half and bfloat16 input) at every key: byte-identical.
template <class CpuCodec, class CudaCodec>
void require_same_packets(CpuCodec const& cpu, CudaCodec const& gpu, std::vector<float> const& x,
                          bool all_keys, bool saturate = true) {
  for_each_element_type([&](auto t) {
    using T = decltype(t);
    INFO("input type " << type_name<T>() << ", n = " << x.size());
    std::vector<T> const xt = convert<T>(x, saturate);
    for (gc::random_stream const& rs : keys()) {
      INFO("key (" << rs.seed << ", " << rs.step << ", " << rs.tensor << ")");
      GCT_REQUIRE_SAME_PACKET(cpu_compress(cpu, xt, rs), cuda_compress(gpu, xt, rs));
      if (!all_keys) break;
    }
  });
}

// Decoding `packet` into float, half and bfloat16 outputs, assigned and added at several
// alphas: bit-identical to the CPU codec (NaN bits aside after an fma).
template <class CpuCodec, class CudaCodec>
void require_same_decoding(CpuCodec const& cpu, CudaCodec const& gpu,
                           std::vector<std::byte> const& packet, std::vector<float> const& init,
                           gc::random_stream const& rs = {}) {
  for_each_element_type([&](auto t) {
    using T = decltype(t);
    INFO("output type " << type_name<T>() << ", n = " << init.size());
    std::vector<T> const it = convert<T>(init);
    CHECK(same_elements(cpu_decode(cpu, packet, it, false, 1.0f, rs),
                        cuda_decode(gpu, packet, it, false, 1.0f, rs), true));
    for (float alpha : {1.0f, -0.75f, 3.0f}) {
      INFO("alpha = " << alpha);
      CHECK(same_elements(cpu_decode(cpu, packet, it, true, alpha, rs),
                          cuda_decode(gpu, packet, it, true, alpha, rs), false));
    }
  });
}

// Residual error feedback over three steps of gradients of type T: the CPU's
// `residual_feedback` (fused with the codec where it can be) and the CUDA codec's
// `compress_with_feedback`, in place or into a second buffer, give the same packets and
// bit-identical residuals.
template <gc::element T, class CpuCodec, class CudaCodec>
void require_same_feedback(CpuCodec const& cpu, CudaCodec const& gpu, std::size_t n,
                           std::uint64_t seed, bool in_place,
                           std::vector<float> const& specials = {}, float scale = 1.0f) {
  INFO("gradient type " << type_name<T>() << ", n = " << n << (in_place ? ", in place" : ""));
  gc::residual_feedback const policy;
  gc::residual_feedback::state state;
  buffer<float> e0(n), e1(n);
  bool started = false;
  for (std::uint32_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    gc::random_stream const rs{seed, step, 5};
    std::vector<float> gf = make_input(n, seed + step, specials);
    for (float& v : gf) v *= scale;
    std::vector<T> const g = convert<T>(gf, true);
    std::vector<std::byte> cpu_packet(cpu.max_compressed_bytes(n));
    gc::tensor_view<T const> const gv(std::span<T const>(g), gc::tensor_id{5});
    cpu_packet.resize(
        policy.compress(cpu, state, gv, std::span<std::byte>(cpu_packet), cpu_context(rs)));

    buffer<T> const dg(g);
    buffer<std::byte> out(gpu.max_compressed_bytes(n));
    float const* before = started ? e0.get() : nullptr;
    float* after = in_place ? e0.get() : e1.get();
    std::size_t const size =
        gpu.compress_with_feedback(dg.get(), before, after, n, out.get(), nullptr, rs);
    GCT_REQUIRE_SAME_PACKET(cpu_packet, out.download(size));
    std::vector<float> const residual = (in_place ? e0 : e1).download();
    std::vector<float> expected(state.values().begin(), state.values().end());
    REQUIRE(expected.size() == n);
    REQUIRE(same_elements(expected, residual, true));
    if (!in_place) e0.upload(residual);
    started = true;
  }
}

// ---------------------------------------------------------------------------------------------
// Rejections.

// A malformed packet must be rejected by the CUDA codec exactly as by the CPU codec (same
// exception type and message), by decompress and decompress_add, into every element type.
// Where the CPU codec checks before it decodes (`untouched`), the output must be left as it
// was; a bad code found while decoding leaves it unspecified, as on the CPU.
template <class CpuCodec, class CudaCodec>
void require_same_rejection(CpuCodec const& cpu, CudaCodec const& gpu,
                            std::vector<std::byte> const& packet, std::size_t n,
                            bool untouched = true) {
  for_each_element_type([&](auto t) {
    using T = decltype(t);
    INFO("output type " << type_name<T>());
    std::vector<T> const init = convert<T>(std::vector<float>(n, 42.0f));
    std::string const expected =
        thrown_by([&] { (void)cpu_decode(cpu, packet, init, false, 1.0f); });
    INFO("CPU codec: " << expected);
    REQUIRE(expected != "none");
    REQUIRE(expected.rfind("error: ", 0) != 0);  // a specific gradcomp error, not a CUDA failure
    CHECK(thrown_by([&] { (void)cpu_decode(cpu, packet, init, true, 0.5f); }) == expected);

    buffer<std::byte> const p(packet);
    buffer<T> out(init);
    CHECK(thrown_by([&] { gpu.decompress(p.get(), packet.size(), out.get(), n); }) == expected);
    CHECK(thrown_by([&] { gpu.decompress_add(p.get(), packet.size(), out.get(), n, 0.5f); }) ==
          expected);
    if (untouched) CHECK(same_elements(out.download(), init, true));
  });
}

inline void put_u32(std::vector<std::byte>& p, std::size_t at, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) p[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xffu);
}
inline void put_u64(std::vector<std::byte>& p, std::size_t at, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) p[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xffu);
}
inline std::vector<std::byte> edited(std::vector<std::byte> p,
                                     std::function<void(std::vector<std::byte>&)> const& edit) {
  edit(p);
  return p;
}

// Mutations every codec must reject: header-level damage.
template <class CpuCodec, class CudaCodec>
void check_header_rejections(CpuCodec const& cpu, CudaCodec const& gpu,
                             std::vector<std::byte> const& good, std::size_t n) {
  using bytes = std::vector<std::byte>;
  for (std::size_t len :
       {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{32}, good.size() - 1}) {
    INFO("truncated to " << len);
    require_same_rejection(cpu, gpu, bytes(good.begin(), good.begin() + len), n);
  }
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { p.push_back(std::byte{0}); }), n);
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { p[0] = std::byte{'X'}; }), n);
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { p[3] = std::byte{0}; }), n);
  require_same_rejection(cpu, gpu,
                         edited(good, [](bytes& p) { p[4] = std::byte{gc::wire_version + 1}; }), n);
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { p[4] = std::byte{0}; }), n);
  for (std::uint8_t id : {1, 2, 3, 4, 5, 6, 7, 8, 9, 200}) {
    if (id == static_cast<std::uint8_t>(CudaCodec::id)) continue;
    INFO("codec id " << unsigned{id});
    require_same_rejection(cpu, gpu, edited(good, [&](bytes& p) { p[5] = std::byte{id}; }), n);
  }
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { p[6] = std::byte{0}; }), n);
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { p[6] = std::byte{9}; }), n);
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { p[7] = std::byte{7}; }), n);
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { put_u32(p, 28, 0x80000000u); }), n);
  // Declared payload disagrees with the buffer; count disagrees with the payload; impossible
  // count; a valid packet of another element count (a config_error, not a format_error).
  require_same_rejection(cpu, gpu,
                         edited(good, [&](bytes& p) { put_u64(p, 16, good.size() - 32 + 2); }), n);
  require_same_rejection(cpu, gpu, edited(good, [&](bytes& p) { put_u64(p, 8, n + 64); }), n);
  require_same_rejection(cpu, gpu, edited(good, [](bytes& p) { put_u64(p, 8, ~std::uint64_t{0}); }),
                         n);
  require_same_rejection(cpu, gpu, cpu_compress(cpu, make_input(n + 8, 99)), n);
}

// A non-finite (or otherwise unencodable) input must throw the CPU codec's exception with its
// message, for every input type.
template <class CpuCodec, class CudaCodec>
void require_same_encode_error(CpuCodec const& cpu, CudaCodec const& gpu,
                               std::vector<float> const& x) {
  for_each_element_type([&](auto t) {
    using T = decltype(t);
    INFO("input type " << type_name<T>());
    std::vector<T> const xt = convert<T>(x);
    std::string const expected = thrown_by([&] { (void)cpu_compress(cpu, xt); });
    INFO("CPU codec: " << expected);
    REQUIRE(expected.rfind("numeric_error: ", 0) == 0);
    CHECK(thrown_by([&] { (void)cuda_compress(gpu, xt); }) == expected);
  });
}

// The two-phase workspace contract: the query answers `workspace_bytes(n)` for every
// operation, a misaligned workspace of that size works, a smaller one is a config_error.
template <class CpuCodec, class CudaCodec>
void check_workspace(CpuCodec const& cpu, CudaCodec const& gpu, std::size_t n) {
  INFO("n = " << n);
  std::vector<float> const x = make_input(n, 12);
  buffer<float> const in(x);
  buffer<std::byte> out(gpu.max_compressed_bytes(n));
  std::size_t const need = gpu.workspace_bytes(n);
  REQUIRE(need > 0);
  std::size_t q = 0;
  CHECK(gpu.compress(nullptr, q, in.get(), n, out.get()) == 0);
  CHECK(q == need);
  q = 0;
  buffer<float> res(n);
  CHECK(gpu.compress_with_feedback(nullptr, q, in.get(), nullptr, res.get(), n, out.get()) == 0);
  CHECK(q == need);
  q = 0;
  gpu.decompress(nullptr, q, out.get(), 0, res.get(), n);
  CHECK(q == need);
  q = 0;
  gpu.decompress_add(nullptr, q, out.get(), 0, res.get(), n);
  CHECK(q == need);

  buffer<std::byte> temp(need + 7);
  for (std::size_t offset : {1, 3, 7}) {
    std::size_t bytes = need;
    std::size_t const size = gpu.compress(temp.get() + offset, bytes, in.get(), n, out.get());
    GCT_REQUIRE_SAME_PACKET(cpu_compress(cpu, x), out.download(size));
  }
  std::size_t small = need - 1;
  std::string const what =
      thrown_by([&] { (void)gpu.compress(temp.get(), small, in.get(), n, out.get()); });
  CHECK(what.rfind("config_error: gradcomp: cuda ", 0) == 0);
  CHECK(thrown_by([&] {
          gpu.decompress(temp.get(), small, out.get(), gpu.max_compressed_bytes(n), res.get(), n);
        }).rfind("config_error: ", 0) == 0);
}

// ---------------------------------------------------------------------------------------------
// The codec configurations checked: every variant, buckets that cut blocks and groups unevenly,
// the whole-tensor bucket.

template <class Fn>
void for_each_cast(Fn&& fn) {
  fn("identity", gc::identity_codec{}, gc::cuda::identity_codec{});
  fn("fp16", gc::fp16_codec{}, gc::cuda::fp16_codec{});
  fn("bf16", gc::bf16_codec{}, gc::cuda::bf16_codec{});
}

template <class Fn>
void for_each_int8(Fn&& fn) {
  using r = gc::int8_rounding;
  fn("int8", gc::int8_codec{}, gc::cuda::int8_codec{});
  fn("int8:rounding=stochastic", gc::int8_codec{512, r::stochastic},
     gc::cuda::int8_codec{512, r::stochastic});
  fn("int8:bucket=0", gc::int8_codec{0}, gc::cuda::int8_codec{0});
  fn("int8:bucket=0,rounding=stochastic", gc::int8_codec{0, r::stochastic},
     gc::cuda::int8_codec{0, r::stochastic});
  fn("int8:bucket=100,rounding=stochastic", gc::int8_codec{100, r::stochastic},
     gc::cuda::int8_codec{100, r::stochastic});
  fn("int8:bucket=5000", gc::int8_codec{5000}, gc::cuda::int8_codec{5000});
}

template <class Fn>
void for_each_int4(Fn&& fn) {
  fn("int4", gc::int4_codec{}, gc::cuda::int4_codec{});
  fn("int4:bucket=0", gc::int4_codec{0}, gc::cuda::int4_codec{0});
  fn("int4:bucket=17", gc::int4_codec{17}, gc::cuda::int4_codec{17});
  fn("int4:bucket=5000", gc::int4_codec{5000}, gc::cuda::int4_codec{5000});
}

template <class Fn>
void for_each_chunk_topk(Fn&& fn) {
  using v = gc::chunk_values;
  fn("chunk_topk", gc::chunk_topk_codec{}, gc::cuda::chunk_topk_codec{});
  fn("chunk_topk:chunk=16,k=3,values=f16", gc::chunk_topk_codec{16, 3, v::f16},
     gc::cuda::chunk_topk_codec{16, 3, v::f16});
  fn("chunk_topk:chunk=8,k=2,values=int2", gc::chunk_topk_codec{8, 2, v::int2},
     gc::cuda::chunk_topk_codec{8, 2, v::int2});
  fn("chunk_topk:chunk=64,k=5,values=int4", gc::chunk_topk_codec{64, 5, v::int4},
     gc::cuda::chunk_topk_codec{64, 5, v::int4});
  fn("chunk_topk:chunk=2,k=2,values=bf16", gc::chunk_topk_codec{2, 2, v::bf16},
     gc::cuda::chunk_topk_codec{2, 2, v::bf16});
  fn("chunk_topk:chunk=1024,k=300,values=int4", gc::chunk_topk_codec{1024, 300, v::int4},
     gc::cuda::chunk_topk_codec{1024, 300, v::int4});
}

template <class Fn>
void for_each_natural(Fn&& fn) {
  fn("natural", gc::natural_codec{}, gc::cuda::natural_codec{});
  fn("natural:bucket=0", gc::natural_codec{0}, gc::cuda::natural_codec{0});
  fn("natural:bucket=100", gc::natural_codec{100}, gc::cuda::natural_codec{100});
}

template <class Fn>
void for_each_dither(Fn&& fn) {
  using p = gc::dither_partition;
  using m = gc::dither_norm;
  fn("qsgd", gc::qsgd_codec{}, gc::cuda::qsgd_codec{});
  fn("qsgd:levels=32767,bucket=0", gc::qsgd_codec{32767, 0}, gc::cuda::qsgd_codec{32767, 0});
  fn("qsgd:levels=255,bucket=100", gc::qsgd_codec{255, 100}, gc::cuda::qsgd_codec{255, 100});
  fn("terngrad", gc::terngrad_codec{}, gc::cuda::terngrad_codec{});
  fn("terngrad:bucket=0", gc::terngrad_codec{0}, gc::cuda::terngrad_codec{0});
  fn("dithering:levels=2", gc::dithering_codec{2}, gc::cuda::dithering_codec{2});
  fn("dithering:levels=5,norm=l2,bucket=16", gc::dithering_codec{5, p::linear, m::l2, 16},
     gc::cuda::dithering_codec{5, p::linear, m::l2, 16});
  fn("dithering:levels=3,partition=natural", gc::dithering_codec{3, p::natural},
     gc::cuda::dithering_codec{3, p::natural});
  fn("dithering:levels=30,partition=natural,norm=l2,bucket=300",
     gc::dithering_codec{30, p::natural, m::l2, 300},
     gc::cuda::dithering_codec{30, p::natural, m::l2, 300});
  fn("dithering:levels=8,partition=natural,bucket=0", gc::dithering_codec{8, p::natural, m::max, 0},
     gc::cuda::dithering_codec{8, p::natural, m::max, 0});
  fn("dithering:levels=127,norm=l2,bucket=5000", gc::dithering_codec{127, p::linear, m::l2, 5000},
     gc::cuda::dithering_codec{127, p::linear, m::l2, 5000});
}

template <class Fn>
void for_each_onebit(Fn&& fn) {
  using s = gc::onebit_codec::scaling;
  fn("onebit", gc::onebit_codec{s::mean_abs}, gc::cuda::onebit_codec{s::mean_abs});
  fn("onebit:scaling=none", gc::onebit_codec{s::none}, gc::cuda::onebit_codec{s::none});
}

// Every quantizer (not the element-type codecs, which carry NaN and infinities).
template <class Fn>
void for_each_quantizer(Fn&& fn) {
  for_each_int8(fn);
  for_each_int4(fn);
  for_each_natural(fn);
  for_each_dither(fn);
  for_each_onebit(fn);
}

// Packets of quantizer inputs at the sizes (all of them for the first configuration of a
// family, the smaller ones for the others) and every key.
template <class CpuCodec, class CudaCodec>
void quantizer_packets(CpuCodec const& cpu, CudaCodec const& gpu, bool large) {
  for (std::size_t n : large ? sizes() : small_sizes()) {
    CHECK(gpu.max_compressed_bytes(n) == cpu.max_compressed_bytes(n));
    require_same_packets(cpu, gpu, make_input(n, 3000 + n, finite_specials()), n < 10000);
  }
  // Constant buckets (hi == lo, a zero norm), all zeros of either sign, tiny values whose
  // statistics are float subnormals.
  for (float v : {-2.5f, 0.125f, 0.0f, -0.0f, -1e-40f, 3e-45f}) {
    INFO("constant " << v);
    require_same_packets(cpu, gpu, std::vector<float>(4097, v), false);
  }
  std::vector<float> tiny = make_input(8192 + 3, 17);
  for (float& v : tiny) v *= 1e-44f;
  require_same_packets(cpu, gpu, tiny, true);
}

// CPU packets decoded by the CUDA codec (float, half and bfloat16 inputs, so every header
// dtype), into every output type.
template <class CpuCodec, class CudaCodec>
void quantizer_decoding(CpuCodec const& cpu, CudaCodec const& gpu) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{513},
                        std::size_t{4097}, std::size_t{70001}}) {
    std::vector<float> const x = make_input(n, 4000 + n, finite_specials());
    std::vector<float> const init = make_input(n, 5000 + n);
    for_each_element_type([&](auto t) {
      using T = decltype(t);
      require_same_decoding(cpu, gpu, cpu_compress(cpu, convert<T>(x, true), keys()[1]), init);
    });
  }
  // A packet decodes by its own header: a codec of other parameters (the default ones) reads it
  // the same way.
  std::vector<float> const x = make_input(4097, 77, finite_specials());
  require_same_decoding(cpu, CudaCodec{}, cpu_compress(cpu, x, keys()[2]), make_input(4097, 78));
}

// Three steps of residual feedback at several sizes, for every gradient type. `scale`
// multiplies the gradients (the 16-bit codecs turn values beyond their range into infinities,
// which then fail the next step, on the CPU as here).
template <class CpuCodec, class CudaCodec>
void all_feedback(CpuCodec const& cpu, CudaCodec const& gpu, std::vector<float> const& specials,
                  float scale = 1.0f) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{513},
                        std::size_t{4097}, std::size_t{70001}}) {
    require_same_feedback<float>(cpu, gpu, n, 21 + n, false, specials, scale);
    require_same_feedback<float>(cpu, gpu, n, 22 + n, true, specials, scale);
    require_same_feedback<gc::half>(cpu, gpu, n, 23 + n, false, {}, scale);
    require_same_feedback<gc::bfloat16>(cpu, gpu, n, 24 + n, true, {}, scale);
  }
}

// Error feedback that must fail: a non-finite gradient element (the message names the first)
// or a residual that overflows with the gradient. The CPU policy's message; the CUDA codec
// leaves a second residual buffer unwritten where it promises to.
template <class CpuCodec, class CudaCodec>
void feedback_errors(CpuCodec const& cpu, CudaCodec const& gpu, bool keeps_residual) {
  float const inf = std::numeric_limits<float>::infinity();
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const big = std::numeric_limits<float>::max();
  struct failing {
    std::size_t n;
    std::vector<std::pair<std::size_t, float>> g;  // planted gradient values
    float residual;                                // every residual element (0: none)
  };
  for (failing const& f :
       {failing{1, {{0, nan}}, 0.0f}, failing{4097, {{4096, -inf}, {5, 0.0f}}, 1.0f},
        failing{8197, {{5000, nan}, {6000, inf}}, 0.0f}, failing{600, {{300, big}}, big}}) {
    INFO("n = " << f.n);
    std::vector<float> g = make_input(f.n, 31);
    for (auto const& [i, v] : f.g) g[i] = v;
    std::vector<float> const e(f.residual != 0.0f ? f.n : 0, f.residual);

    gc::residual_feedback const policy;
    gc::residual_feedback::state state;
    if (!e.empty()) state.assign(e);
    std::vector<std::byte> cpu_out(cpu.max_compressed_bytes(f.n));
    std::string const expected = thrown_by([&] {
      (void)policy.compress(
          cpu, state, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{9}),
          std::span<std::byte>(cpu_out), cpu_context({1, 2, 9}));
    });
    INFO("CPU: " << expected);
    REQUIRE(expected.rfind("numeric_error: gradcomp: residual_feedback", 0) == 0);

    buffer<float> const dg(g);
    buffer<float> const de(e.empty() ? std::vector<float>(f.n, 0.0f) : e);
    std::vector<float> const sentinel(f.n, -123.0f);
    buffer<float> next(sentinel);
    buffer<std::byte> out(gpu.max_compressed_bytes(f.n));
    CHECK(thrown_by([&] {
            (void)gpu.compress_with_feedback(dg.get(), e.empty() ? nullptr : de.get(), next.get(),
                                             f.n, out.get(), nullptr, {1, 2, 9});
          }) == expected);
    if (keeps_residual) CHECK(next.download() == sentinel);
  }
}

// Plants non-finite values and requires the CPU codec's error: the first one (in element
// order) is named.
template <class CpuCodec, class CudaCodec>
void nonfinite_inputs(CpuCodec const& cpu, CudaCodec const& gpu) {
  float const inf = std::numeric_limits<float>::infinity();
  float const nan = std::numeric_limits<float>::quiet_NaN();
  struct plant {
    std::size_t n, at;
    float v;
  };
  for (plant const p : {plant{1, 0, nan}, plant{4097, 0, inf}, plant{4097, 4096, -inf},
                        plant{8192 + 5, 5000, -nan}, plant{100, 50, nan}, plant{1500, 1023, inf}}) {
    INFO("n = " << p.n << ", at " << p.at);
    std::vector<float> x = make_input(p.n, 11);
    x[p.at] = p.v;
    if (p.at + 7 < p.n) x[p.at + 7] = inf;  // only the first one is reported
    if (p.at + 700 < p.n) x[p.at + 700] = nan;
    require_same_encode_error(cpu, gpu, x);
  }
}

}  // namespace gct

// =============================================================================================
// Element-type codecs: identity, fp16, bf16.

TEST_CASE(GCT_BACKEND ": element-type codecs write the CPU codecs' packets", "[cuda][cast]") {
  gct::for_each_cast([](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    for (std::size_t n : gct::sizes()) {
      gct::require_same_packets(cpu, gpu, gct::make_input(n, 1000 + n, gct::fp16_specials()), false,
                                false);
      gct::require_same_packets(cpu, gpu, gct::random_bits(n, 2000 + n), false, false);
    }
  });
}

TEST_CASE(GCT_BACKEND ": element-type codecs decode like the CPU codecs", "[cuda][cast]") {
  gct::for_each_cast([](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4097}, std::size_t{70001}}) {
      std::vector<float> const x = gct::make_input(n, 3000 + n, gct::fp16_specials());
      std::vector<float> const init = gct::make_input(n, 4000 + n);
      gct::for_each_element_type([&](auto t) {
        using T = decltype(t);
        gct::require_same_decoding(cpu, gpu, gct::cpu_compress(cpu, gct::convert<T>(x)), init);
      });
    }
  });
}

TEST_CASE(GCT_BACKEND ": 16-bit payloads decode like the CPU codecs, every bit pattern",
          "[cuda][cast]") {
  std::size_t const n = 65536;
  std::vector<float> const init = gct::make_input(n, 5);
  auto patterns = [&](auto const& cpu, gc::dtype type) {
    std::vector<std::byte> packet = gct::cpu_compress(cpu, std::vector<float>(n, 0.0f));
    packet[6] = static_cast<std::byte>(type);
    for (std::size_t i = 0; i < n; ++i) {
      packet[32 + 2 * i] = static_cast<std::byte>(i & 0xffu);
      packet[32 + 2 * i + 1] = static_cast<std::byte>(i >> 8);
    }
    return packet;
  };
  gct::require_same_decoding(gc::fp16_codec{}, gc::cuda::fp16_codec{},
                             patterns(gc::fp16_codec{}, gc::dtype::f32), init);
  gct::require_same_decoding(gc::bf16_codec{}, gc::cuda::bf16_codec{},
                             patterns(gc::bf16_codec{}, gc::dtype::f16), init);
  std::vector<std::byte> id =
      gct::cpu_compress(gc::identity_codec{}, gct::convert<gc::half>(std::vector<float>(n)));
  for (std::size_t i = 0; i < n; ++i) {
    id[32 + 2 * i] = static_cast<std::byte>(i & 0xffu);
    id[32 + 2 * i + 1] = static_cast<std::byte>(i >> 8);
  }
  gct::require_same_decoding(gc::identity_codec{}, gc::cuda::identity_codec{}, id, init);
}

TEST_CASE(GCT_BACKEND ": element-type codecs fuse error feedback like residual_feedback",
          "[cuda][cast][feedback]") {
  gct::for_each_cast([](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    // Within binary16's range: larger values make infinite residuals (also on the CPU).
    gct::all_feedback(cpu, gpu, {0.0f, -0.0f, 1e-40f, -3e-39f, 0.5f, 65504.0f, -2.5f}, 1e-4f);
    gct::feedback_errors(cpu, gpu, false);
  });
}

TEST_CASE(GCT_BACKEND ": element-type codecs reject malformed packets like the CPU codecs",
          "[cuda][cast]") {
  gct::for_each_cast([](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    gct::check_header_rejections(cpu, gpu, gct::cpu_compress(cpu, gct::make_input(100, 7)), 100);
    gct::check_workspace(cpu, gpu, 0);
    gct::check_workspace(cpu, gpu, 4097);
  });
}

// =============================================================================================
// Quantizers: int8, natural, QSGD / TernGrad / dithering, onebit. One test case per family and
// property, so that each ctest case stays short.

#define GCT_QUANTIZER_CASES(family, tag)                                                \
  TEST_CASE(GCT_BACKEND ": " #family " writes the CPU codec's packets", "[cuda]" tag) { \
    bool first = true;                                                                  \
    gct::for_each_##family([&](char const* name, auto const& cpu, auto const& gpu) {    \
      INFO(name);                                                                       \
      gct::quantizer_packets(cpu, gpu, first);                                          \
      first = false;                                                                    \
    });                                                                                 \
  }                                                                                     \
  TEST_CASE(GCT_BACKEND ": " #family " decodes like the CPU codec", "[cuda]" tag) {     \
    gct::for_each_##family([](char const* name, auto const& cpu, auto const& gpu) {     \
      INFO(name);                                                                       \
      gct::quantizer_decoding(cpu, gpu);                                                \
    });                                                                                 \
  }                                                                                     \
  TEST_CASE(GCT_BACKEND ": " #family " fuses error feedback like residual_feedback",    \
            "[cuda][feedback]" tag) {                                                   \
    gct::for_each_##family([](char const* name, auto const& cpu, auto const& gpu) {     \
      INFO(name);                                                                       \
      gct::all_feedback(cpu, gpu, gct::finite_specials());                              \
      gct::feedback_errors(cpu, gpu, true);                                             \
    });                                                                                 \
  }                                                                                     \
  TEST_CASE(GCT_BACKEND ": " #family " rejects non-finite inputs like the CPU codec",   \
            "[cuda]" tag) {                                                             \
    gct::for_each_##family([](char const* name, auto const& cpu, auto const& gpu) {     \
      INFO(name);                                                                       \
      gct::nonfinite_inputs(cpu, gpu);                                                  \
      gct::check_workspace(cpu, gpu, 0);                                                \
      gct::check_workspace(cpu, gpu, 8197);                                             \
    });                                                                                 \
  }

GCT_QUANTIZER_CASES(int8, "[int8]")
GCT_QUANTIZER_CASES(int4, "[int4]")
GCT_QUANTIZER_CASES(chunk_topk, "[chunk_topk]")
GCT_QUANTIZER_CASES(natural, "[natural]")
GCT_QUANTIZER_CASES(dither, "[dither]")
GCT_QUANTIZER_CASES(onebit, "[onebit]")

#undef GCT_QUANTIZER_CASES

TEST_CASE(GCT_BACKEND ": int8 ranges take the sign of the bucket's first zero", "[cuda][int8]") {
  // Minimum or maximum zero, with zeros of both signs in lanes that the lane order visits
  // before the index order does: the CPU's sequential scan keeps the first zero by index.
  for (std::uint32_t bucket : {0u, 512u, 5000u}) {
    gc::int8_codec const cpu(bucket);
    gc::cuda::int8_codec const gpu(bucket);
    for (float first : {0.0f, -0.0f}) {
      INFO("bucket " << bucket << ", first zero " << first);
      std::vector<float> x(8192 + 5, 1.0f);
      for (std::size_t b = 0; b < x.size(); b += 512) {
        x[b + 2] = first;                           // lane 2 of the block
        if (b + 17 < x.size()) x[b + 17] = -first;  // lane 1: visited first in lane order
      }
      gct::require_same_packets(cpu, gpu, x, false);
      for (float& v : x) v = -v;  // the zero is now the maximum
      gct::require_same_packets(cpu, gpu, x, false);
    }
  }
}

TEST_CASE(GCT_BACKEND ": int8 extreme ranges and rejected ranges", "[cuda][int8]") {
  gc::int8_codec const cpu(16);
  gc::cuda::int8_codec const gpu(16);
  float const big = std::numeric_limits<float>::max();
  std::vector<float> x = gct::make_input(100, 41);
  x[0] = big;
  x[1] = -big;  // hi - lo overflows float, not double
  x[40] = 1e-45f;
  gct::require_same_packets(cpu, gpu, x, true);

  std::size_t const n = 100;
  std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(n, 13));
  gct::check_header_rejections(cpu, gpu, good, n);
  using bytes = std::vector<std::byte>;
  for (std::size_t k : {0u, 3u, 6u}) {
    for (auto const& [lo, hi] :
         {std::pair{0x7fc00000u, 0x3f800000u}, std::pair{0xbf800000u, 0x7f800000u},
          std::pair{0x40000000u, 0x3f800000u}}) {
      INFO("bucket " << k << " range bits 0x" << std::hex << lo << ", 0x" << hi);
      gct::require_same_rejection(cpu, gpu,
                                  gct::edited(good,
                                              [&](bytes& p) {
                                                gct::put_u32(p, 32 + 8 * k, lo);
                                                gct::put_u32(p, 36 + 8 * k, hi);
                                              }),
                                  n);
    }
  }
}

TEST_CASE(GCT_BACKEND ": int4 zero and extreme buckets, rejected scales", "[cuda][int4]") {
  // Buckets of zeros whose first zero is -0 (the scale is +0 on both backends), extreme
  // magnitudes, subnormal buckets.
  for (std::uint32_t bucket : {0u, 16u, 17u, 64u}) {
    gc::int4_codec const cpu(bucket);
    gc::cuda::int4_codec const gpu(bucket);
    INFO("bucket " << bucket);
    std::vector<float> x = gct::make_input(300, 43);
    for (std::size_t i = 64; i < 128; ++i) x[i] = i % 3 == 0 ? 0.0f : -0.0f;
    x[64] = -0.0f;
    x[5] = std::numeric_limits<float>::max();
    x[6] = -std::numeric_limits<float>::max();
    for (std::size_t i = 200; i < 264; ++i) x[i] *= 1e-43f;
    gct::require_same_packets(cpu, gpu, x, false);
  }

  gc::int4_codec const cpu(16);
  gc::cuda::int4_codec const gpu(16);
  std::size_t const n = 100;  // 7 buckets, an even count
  std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(n, 13));
  gct::check_header_rejections(cpu, gpu, good, n);
  using bytes = std::vector<std::byte>;
  float const above = std::nextafter(gc::int4_format::max_scale(), std::numeric_limits<float>::infinity());
  for (std::size_t k : {0u, 3u, 6u}) {
    for (std::uint32_t bad : {0x7fc00000u, 0x7f800000u, 0xff800000u, 0xbf800000u, 0x80000001u,
                              gct::to_bits(above)}) {
      INFO("scale of bucket " << k << ": 0x" << std::hex << bad);
      gct::require_same_rejection(
          cpu, gpu, gct::edited(good, [&](bytes& p) { gct::put_u32(p, 32 + 4 * k, bad); }), n);
    }
  }
  // Every nibble decodes (0, never written, is -8 steps), and so do the largest scale and -0.
  bytes odd = good;
  for (std::size_t i = 32 + 28; i < odd.size(); ++i) odd[i] = static_cast<std::byte>(i * 37);
  gct::put_u32(odd, 32, gct::to_bits(gc::int4_format::max_scale()));
  gct::put_u32(odd, 36, 0x80000000u);
  gct::require_same_decoding(cpu, gpu, odd, gct::make_input(n, 14));
}

TEST_CASE(GCT_BACKEND ": chunk_topk ties, and malformed packets", "[cuda][chunk_topk]") {
  using v = gc::chunk_values;
  // Ties at the k-th largest magnitude (the first ones by index are kept), signed zeros,
  // chunks of one value, a short last chunk shorter than k.
  for (auto values : {v::f32, v::int2, v::bf16}) {
    gc::chunk_topk_codec const cpu(32, 7, values);
    gc::cuda::chunk_topk_codec const gpu(32, 7, values);
    INFO("values " << static_cast<unsigned>(values));
    std::vector<float> x(32 * 5 + 3);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
    for (std::size_t i = 32; i < 64; ++i) x[i] = i % 2 == 0 ? 0.0f : -0.0f;
    for (std::size_t i = 64; i < 96; ++i) x[i] = -1.5f;
    gct::require_same_packets(cpu, gpu, x, false);
    gct::require_same_decoding(cpu, gpu, gct::cpu_compress(cpu, x), gct::make_input(x.size(), 3));
  }

  std::size_t const n = 16 * 6 + 5;  // 7 chunks, the last of 5 elements
  using bytes = std::vector<std::byte>;
  for (auto values : {v::f32, v::f16, v::int4}) {
    gc::chunk_topk_codec const cpu(16, 6, values);
    gc::cuda::chunk_topk_codec const gpu(16, 6, values);
    INFO("values " << static_cast<unsigned>(values));
    bytes const good = gct::cpu_compress(cpu, gct::make_input(n, 13));
    gct::check_header_rejections(cpu, gpu, good, n);
    gc::chunk_topk_format const f = cpu.wire_format();
    std::size_t const vals = 32 + f.values_offset(16, values, n);
    std::size_t const idx = 32 + f.indices_offset(16, 6, values, n);
    // Index fields are 4 bits: field j is nibble j of the index section.
    auto set_index = [&](bytes& p, std::size_t j, unsigned i) {
      auto& b = p[idx + j / 2];
      unsigned const shift = 4 * (j % 2);
      b = static_cast<std::byte>((static_cast<unsigned>(b) & ~(0xfu << shift)) | (i << shift));
    };
    for (std::size_t j : {std::size_t{0}, std::size_t{13}, std::size_t{35}}) {
      INFO("index field " << j);
      // Equal to its predecessor (or, for a chunk's first, past the next).
      gct::require_same_rejection(cpu, gpu, gct::edited(good, [&](bytes& p) {
                                    unsigned const mine = (static_cast<unsigned>(p[idx + j / 2]) >> (4 * (j % 2))) & 0xfu;
                                    set_index(p, j + 1, mine);
                                  }),
                                  n);
    }
    // An index past the short last chunk (5 elements).
    gct::require_same_rejection(cpu, gpu, gct::edited(good, [&](bytes& p) { set_index(p, 36 + 4, 5); }),
                                n);
    if (values == v::f32) {
      for (std::uint32_t bad : {0x7fc00000u, 0xff800000u}) {
        gct::require_same_rejection(
            cpu, gpu, gct::edited(good, [&](bytes& p) { gct::put_u32(p, vals + 4 * 20, bad); }), n);
      }
    } else if (values == v::f16) {
      gct::require_same_rejection(cpu, gpu, gct::edited(good, [&](bytes& p) {
                                    p[vals + 2 * 9] = std::byte{0x00};
                                    p[vals + 2 * 9 + 1] = std::byte{0x7c};
                                  }),
                                  n);
    } else {
      for (std::size_t c : {std::size_t{0}, std::size_t{6}}) {
        for (std::uint32_t bad : {0x7fc00000u, 0xbf800000u, 0x7f7fffffu}) {
          INFO("step of chunk " << c << ": 0x" << std::hex << bad);
          gct::require_same_rejection(
              cpu, gpu, gct::edited(good, [&](bytes& p) { gct::put_u32(p, 32 + 4 * c, bad); }), n);
        }
      }
    }
  }
}

TEST_CASE(GCT_BACKEND ": natural refuses what the CPU codec refuses", "[cuda][natural]") {
  gc::natural_codec const cpu(100);
  gc::cuda::natural_codec const gpu(100);
  // |x| >= 2^127 is finite but unencodable; a NaN in a later bucket is not reported first.
  std::vector<float> x = gct::make_input(1000, 51);
  x[250] = 1.7014118e38f;
  x[120] = std::numeric_limits<float>::quiet_NaN();
  gct::require_same_encode_error(cpu, gpu, x);
  x[120] = 1.0f;
  gct::require_same_encode_error(cpu, gpu, x);
  x[250] = 1.69e38f;  // below 2^127, also as bfloat16: encodable
  gct::require_same_packets(cpu, gpu, x, true);

  std::size_t const n = 1000;
  std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(n, 13));
  gct::check_header_rejections(cpu, gpu, good, n);
  using bytes = std::vector<std::byte>;
  for (std::size_t k : {0u, 4u, 9u}) {
    INFO("exponent of bucket " << k);
    gct::require_same_rejection(
        cpu, gpu, gct::edited(good, [&](bytes& p) { p[32 + k] = std::byte{254}; }), n);
  }
  // Codes no encoder writes (k above E + 1, a signed zero), found while decoding.
  for (std::size_t i : {0u, 500u, 999u}) {
    INFO("code of element " << i);
    gct::require_same_rejection(
        cpu, gpu, gct::edited(good, [&](bytes& p) { p[32 + 10 + i] = std::byte{0x80}; }), n, false);
    gct::require_same_rejection(cpu, gpu,
                                gct::edited(good,
                                            [&](bytes& p) {
                                              p[32 + i / 100] = std::byte{3};
                                              p[32 + 10 + i] = std::byte{5};
                                            }),
                                n, false);
  }
}

TEST_CASE(GCT_BACKEND ": dithering codecs refuse what the CPU codecs refuse", "[cuda][dither]") {
  using p = gc::dither_partition;
  using m = gc::dither_norm;
  // An L2 norm beyond float32 (finite elements); a NaN in a later bucket is not reported first.
  {
    gc::qsgd_codec const cpu(7, 64);
    gc::cuda::qsgd_codec const gpu(7, 64);
    std::vector<float> x = gct::make_input(1000, 61);
    for (std::size_t i = 128; i < 132; ++i) x[i] = 3e38f;
    x[700] = std::numeric_limits<float>::quiet_NaN();
    gct::require_same_encode_error(cpu, gpu, x);
  }
  auto malformed = [](auto const& cpu, auto const& gpu, std::size_t n) {
    std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(n, 13));
    gct::check_header_rejections(cpu, gpu, good, n);
    using bytes = std::vector<std::byte>;
    gc::detail::dither_config const cfg = cpu.config();
    std::size_t const nb = cfg.buckets(n);
    unsigned const w = cfg.shape().width;
    for (std::size_t k : {std::size_t{0}, nb / 2, nb - 1}) {
      for (std::uint32_t bad : {0x7fc00000u, 0x7f800000u, 0xbf800000u, 0x80000000u}) {
        INFO("scale of bucket " << k << ": 0x" << std::hex << bad);
        gct::require_same_rejection(
            cpu, gpu, gct::edited(good, [&](bytes& q) { gct::put_u32(q, 32 + 4 * k, bad); }), n);
      }
    }
    if ((n * w) % 8 != 0) {  // padding bits, checked after the scales
      gct::require_same_rejection(
          cpu, gpu, gct::edited(good, [&](bytes& q) { q.back() |= std::byte{0x80}; }), n);
      gct::require_same_rejection(cpu, gpu,
                                  gct::edited(good,
                                              [&](bytes& q) {
                                                q.back() |= std::byte{0x80};
                                                gct::put_u32(q, 32 + 4 * (nb - 1), 0x7fc00000u);
                                              }),
                                  n);
    }
    // A code above s levels, and a negative zero code, found while decoding.
    for (std::size_t i : {std::size_t{0}, n / 2}) {
      std::uint32_t const code_bits[] = {(1u << (w - 1)) - 1u, 1u << (w - 1)};
      for (std::uint32_t c : code_bits) {
        if ((c & ((1u << (w - 1)) - 1u)) <= cfg.s && c != (1u << (w - 1))) continue;
        INFO("code 0x" << std::hex << c << " at element " << std::dec << i);
        gct::require_same_rejection(
            cpu, gpu,
            gct::edited(good,
                        [&](bytes& q) {
                          std::byte* codes = q.data() + 32 + 4 * nb;
                          for (unsigned b = 0; b < w; ++b) {
                            std::uint64_t const bit = i * w + b;
                            auto const mask = static_cast<std::byte>(1u << (bit % 8));
                            codes[bit / 8] =
                                (c >> b) & 1u ? codes[bit / 8] | mask : codes[bit / 8] & ~mask;
                          }
                        }),
            n, false);
      }
    }
  };
  malformed(gc::qsgd_codec{5, 100}, gc::cuda::qsgd_codec{5, 100}, 1001);
  malformed(gc::terngrad_codec{64}, gc::cuda::terngrad_codec{64}, 1001);
  malformed(gc::dithering_codec{3, p::natural, m::l2, 100},
            gc::cuda::dithering_codec{3, p::natural, m::l2, 100}, 999);
}

// =============================================================================================
// onebit: the canonical summation order, non-finite inputs, malformed packets.

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

TEST_CASE(GCT_BACKEND ": onebit keeps the CPU's signs and scale at the extremes",
          "[cuda][onebit]") {
  gct::for_each_onebit([](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    for (std::size_t n : gct::small_sizes()) {
      gct::require_same_packets(cpu, gpu, gct::make_input(n, 8000 + n, gct::onebit_specials()),
                                false);
    }
  });
}

TEST_CASE(GCT_BACKEND ": onebit rejects malformed packets like the CPU codec", "[cuda][onebit]") {
  using scaling = gc::onebit_codec::scaling;
  gc::onebit_codec const cpu;
  gc::cuda::onebit_codec const gpu;
  std::size_t const n = 100;  // 12.5 bytes of signs: 4 padding bits
  std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(n, 13));
  using bytes = std::vector<std::byte>;

  gct::check_header_rejections(cpu, gpu, good, n);
  for (std::uint32_t bad_scale :
       {0x7fc00000u, 0x7f800000u, 0xff800000u, 0xbf800000u, 0x80000000u}) {
    INFO("scale bits 0x" << std::hex << bad_scale);
    gct::require_same_rejection(
        cpu, gpu, gct::edited(good, [&](bytes& p) { gct::put_u32(p, 32, bad_scale); }), n);
  }
  // An unscaled packet must carry scale 1; the reserved word must be 0; padding bits 0.
  gct::require_same_rejection(cpu, gpu, gct::edited(good, [](bytes& p) { p[7] = std::byte{1}; }),
                              n);
  gct::require_same_rejection(cpu, gpu, gct::edited(good, [](bytes& p) { gct::put_u32(p, 36, 1); }),
                              n);
  for (unsigned bit = 4; bit < 8; ++bit) {
    INFO("padding bit " << bit);
    gct::require_same_rejection(
        cpu, gpu,
        gct::edited(good, [&](bytes& p) { p.back() |= static_cast<std::byte>(1u << bit); }), n);
  }
  // A full last byte (n % 8 == 0) is valid.
  gc::onebit_codec const cpu_none(scaling::none);
  gc::cuda::onebit_codec const gpu_none(scaling::none);
  gct::require_same_decoding(cpu_none, gpu_none,
                             gct::cpu_compress(cpu_none, gct::make_input(96, 14)),
                             std::vector<float>(96, 1.0f));
}

// =============================================================================================
// The golden packets of the CPU suite (tests/unit/support/golden_packets.hpp): the CUDA codecs
// write the same bytes for the formula input at the golden key, and decode them like the CPU.

namespace gct {

// Runs `fn(cpu, gpu)` with the codecs of a golden spec; false for specs without a CUDA codec.
template <class Fn>
bool with_golden_codecs(std::string const& spec, Fn&& fn) {
  bool found = false;
  auto visit = [&](char const* name, auto const& cpu, auto const& gpu) {
    if (spec != name) return;
    found = true;
    fn(cpu, gpu);
  };
  using r = gc::int8_rounding;
  using p = gc::dither_partition;
  using m = gc::dither_norm;
  for_each_cast(visit);
  for_each_onebit(visit);
  visit("int8:bucket=16", gc::int8_codec{16}, gc::cuda::int8_codec{16});
  visit("int8:bucket=16,rounding=stochastic", gc::int8_codec{16, r::stochastic},
        gc::cuda::int8_codec{16, r::stochastic});
  visit("int4:bucket=16", gc::int4_codec{16}, gc::cuda::int4_codec{16});
  visit("chunk_topk:chunk=16,k=3", gc::chunk_topk_codec{16, 3}, gc::cuda::chunk_topk_codec{16, 3});
  visit("chunk_topk:chunk=8,k=2,values=int2", gc::chunk_topk_codec{8, 2, gc::chunk_values::int2},
        gc::cuda::chunk_topk_codec{8, 2, gc::chunk_values::int2});
  visit("natural:bucket=16", gc::natural_codec{16}, gc::cuda::natural_codec{16});
  visit("qsgd:levels=7,bucket=16", gc::qsgd_codec{7, 16}, gc::cuda::qsgd_codec{7, 16});
  visit("qsgd:levels=255,bucket=0", gc::qsgd_codec{255, 0}, gc::cuda::qsgd_codec{255, 0});
  visit("terngrad:bucket=16", gc::terngrad_codec{16}, gc::cuda::terngrad_codec{16});
  visit("dithering:levels=2,partition=linear,norm=max,bucket=16",
        gc::dithering_codec{2, p::linear, m::max, 16},
        gc::cuda::dithering_codec{2, p::linear, m::max, 16});
  visit("dithering:levels=5,partition=linear,norm=l2,bucket=16",
        gc::dithering_codec{5, p::linear, m::l2, 16},
        gc::cuda::dithering_codec{5, p::linear, m::l2, 16});
  visit("dithering:levels=3,partition=natural,norm=max,bucket=16",
        gc::dithering_codec{3, p::natural, m::max, 16},
        gc::cuda::dithering_codec{3, p::natural, m::max, 16});
  visit("dithering:levels=30,partition=natural,norm=l2,bucket=16",
        gc::dithering_codec{30, p::natural, m::l2, 16},
        gc::cuda::dithering_codec{30, p::natural, m::l2, 16});
  visit("randomk:k=9,scale=true", gc::scaled_random_k_codec::count(9),
        gc::cuda::scaled_random_k_codec::count(9));
  visit("randomk:k=5,values=bf16", gc::random_k_codec::count(5, gc::sparse_values::bf16),
        gc::cuda::random_k_codec::count(5, gc::sparse_values::bf16));
  visit("approx_topk:k=6,tolerance=0.2", gc::approx_topk_codec::count(6, 0.001, 0.2),
        gc::cuda::approx_topk_codec::count(6, 0.001, 0.2));
  return found;
}

inline std::vector<std::byte> golden_bytes(char const* hex) {
  auto nibble = [](char c) { return static_cast<unsigned>(c <= '9' ? c - '0' : c - 'a' + 10); };
  std::vector<std::byte> out(std::strlen(hex) / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>((nibble(hex[2 * i]) << 4) | nibble(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace gct

TEST_CASE(GCT_BACKEND ": the CUDA codecs write and read the golden packets", "[cuda][golden]") {
  std::size_t covered = 0;
  for (gradcomp_test::golden const& g : gradcomp_test::goldens) {
    INFO(g.spec << " (" << gc::dtype_name(g.input) << " input)");
    gc::random_stream const rs{gradcomp_test::golden_seed, gradcomp_test::golden_step,
                               static_cast<std::uint32_t>(gradcomp_test::golden_tensor)};
    std::vector<float> const x = gradcomp_test::formula_input(37);
    std::vector<std::byte> const want = gct::golden_bytes(g.hex);
    covered += gct::with_golden_codecs(g.spec, [&](auto const& cpu, auto const& gpu) {
      switch (g.input) {
        case gc::dtype::f16:
          GCT_REQUIRE_SAME_PACKET(want, gct::cuda_compress(gpu, gct::convert<gc::half>(x), rs));
          break;
        case gc::dtype::bf16:
          GCT_REQUIRE_SAME_PACKET(want, gct::cuda_compress(gpu, gct::convert<gc::bfloat16>(x), rs));
          break;
        default: GCT_REQUIRE_SAME_PACKET(want, gct::cuda_compress(gpu, x, rs));
      }
      gct::require_same_decoding(cpu, gpu, want, gct::make_input(37, 1), rs);
    });
  }
  // Every golden codec has a CUDA version.
  CHECK(covered == std::size(gradcomp_test::goldens));
}

#include "sparse_checks.cuh"
#include "powersgd_checks.cuh"
