// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// The sparsifiers' cases shared by the two CUDA test programs (included by codec_checks.cuh,
// whose helpers they use): exact top-k, approximate top-k, threshold, random-k and scaled
// random-k run next to the CPU codecs, live. Packets byte-identical for every input type and
// odd size, heavy ties, k = 0, 1 and n, both index encodings and every value type; decoding
// bit-identical; error feedback identical; the same rejections with the same messages.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace gct {

inline std::vector<std::size_t> const& sparse_sizes() {
  static std::vector<std::size_t> const s = {0, 1, 2, 7, 17, 127, 128, 129, 4095, 4096, 4097, 100003};
  return s;
}

// Magnitudes from a handful of values with random signs (and both zeros): most elements tie
// with many others, so the selection's tie rule decides the packet.
inline std::vector<float> tied_input(std::size_t n, std::uint64_t seed, unsigned distinct) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    auto const m = static_cast<unsigned>(rng() % distinct);
    v = static_cast<float>(m) * 0.5f;
    if (rng() & 1u) v = -v;
  }
  return x;
}

template <class Fn>
void for_each_topk(Fn&& fn) {
  using v = gc::sparse_values;
  fn("topk", gc::topk_codec{}, gc::cuda::topk_codec{});
  fn("topk:k=1", gc::topk_codec::count(1), gc::cuda::topk_codec::count(1));
  fn("topk:k=0", gc::topk_codec::count(0), gc::cuda::topk_codec::count(0));
  fn("topk:k=37,values=f16", gc::topk_codec::count(37, v::f16),
     gc::cuda::topk_codec::count(37, v::f16));
  fn("topk:ratio=0.3,values=bf16", gc::topk_codec::ratio(0.3, v::bf16),
     gc::cuda::topk_codec::ratio(0.3, v::bf16));
  fn("topk:ratio=1 (k = n)", gc::topk_codec::ratio(1.0), gc::cuda::topk_codec::ratio(1.0));
  fn("topk:k=2^40 (k > n)", gc::topk_codec::count(std::uint64_t{1} << 40),
     gc::cuda::topk_codec::count(std::uint64_t{1} << 40));
  fn("approx_topk", gc::approx_topk_codec{}, gc::cuda::approx_topk_codec{});
  fn("approx_topk:k=100,tolerance=0.3,values=f16",
     gc::approx_topk_codec::count(100, 0.01, 0.3, v::f16),
     gc::cuda::approx_topk_codec::count(100, 0.01, 0.3, v::f16));
}

template <class Fn>
void for_each_threshold(Fn&& fn) {
  using v = gc::sparse_values;
  fn("threshold:0 (every element)", gc::threshold_codec{0.0f}, gc::cuda::threshold_codec{0.0f});
  fn("threshold:1", gc::threshold_codec{1.0f}, gc::cuda::threshold_codec{1.0f});
  fn("threshold:0.5 (a tie magnitude),values=f16", gc::threshold_codec{0.5f, v::f16},
     gc::cuda::threshold_codec{0.5f, v::f16});
  fn("threshold:1e3,values=bf16", gc::threshold_codec{1e3f, v::bf16},
     gc::cuda::threshold_codec{1e3f, v::bf16});
  fn("threshold:-0", gc::threshold_codec{-0.0f}, gc::cuda::threshold_codec{-0.0f});
  fn("threshold:FLT_MAX (none)", gc::threshold_codec{std::numeric_limits<float>::max()},
     gc::cuda::threshold_codec{std::numeric_limits<float>::max()});
}

template <class Fn>
void for_each_randomk(Fn&& fn) {
  using v = gc::sparse_values;
  fn("random_k", gc::random_k_codec{}, gc::cuda::random_k_codec{});
  fn("random_k:k=1", gc::random_k_codec::count(1), gc::cuda::random_k_codec::count(1));
  fn("random_k:k=0", gc::random_k_codec::count(0), gc::cuda::random_k_codec::count(0));
  fn("random_k:ratio=0.4,values=f16", gc::random_k_codec::ratio(0.4, v::f16),
     gc::cuda::random_k_codec::ratio(0.4, v::f16));
  fn("random_k:ratio=1", gc::random_k_codec::ratio(1.0), gc::cuda::random_k_codec::ratio(1.0));
  fn("scaled_random_k", gc::scaled_random_k_codec{}, gc::cuda::scaled_random_k_codec{});
  fn("scaled_random_k:k=300,values=bf16", gc::scaled_random_k_codec::count(300, v::bf16),
     gc::cuda::scaled_random_k_codec::count(300, v::bf16));
  fn("scaled_random_k:ratio=0.05,values=f16", gc::scaled_random_k_codec::ratio(0.05, v::f16),
     gc::cuda::scaled_random_k_codec::ratio(0.05, v::f16));
}

// Packets of general, tied and constant inputs at the sparse sizes (2^20 + 3 as well for the
// first configuration of a family), for every input type and key.
template <class CpuCodec, class CudaCodec>
void sparse_packets(CpuCodec const& cpu, CudaCodec const& gpu, bool large) {
  std::vector<std::size_t> sizes = sparse_sizes();
  if (large) sizes.push_back((std::size_t{1} << 20) + 3);
  for (std::size_t n : sizes) {
    CHECK(gpu.max_compressed_bytes(n) == cpu.max_compressed_bytes(n));
    require_same_packets(cpu, gpu, make_input(n, 7000 + n, finite_specials()), n < 10000);
    require_same_packets(cpu, gpu, tied_input(n, 8000 + n, 3), false);
    require_same_packets(cpu, gpu, tied_input(n, 9000 + n, 40), false);
  }
  for (float c : {0.0f, -0.0f, 1.5f, -1e-40f}) {
    INFO("constant " << c);
    require_same_packets(cpu, gpu, std::vector<float>(4097, c), false);
  }
  // Alternating zeros of both signs, and a single non-zero at the end.
  std::vector<float> z(5003, 0.0f);
  for (std::size_t i = 0; i < z.size(); i += 2) z[i] = -0.0f;
  require_same_packets(cpu, gpu, z, false);
  z.back() = 3.0f;
  require_same_packets(cpu, gpu, z, false);
}

// CPU packets (of every input type, at two keys) decoded by the CUDA codec; a packet of other
// parameters decodes by its own header.
template <class CpuCodec, class CudaCodec>
void sparse_decoding(CpuCodec const& cpu, CudaCodec const& gpu) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4097},
                        std::size_t{70001}}) {
    std::vector<float> const x = make_input(n, 4100 + n, finite_specials());
    std::vector<float> const init = make_input(n, 5100 + n);
    for_each_element_type([&](auto t) {
      using T = decltype(t);
      for (gc::random_stream const& rs : {keys()[0], keys()[1]}) {
        require_same_decoding(cpu, gpu, cpu_compress(cpu, convert<T>(x, true), rs), init, rs);
      }
    });
    require_same_decoding(cpu, gpu, cpu_compress(cpu, tied_input(n, 3 + n, 4), keys()[2]), init,
                          keys()[2]);
  }
  std::vector<float> const x = make_input(4097, 79, finite_specials());
  require_same_decoding(cpu, CudaCodec{}, cpu_compress(cpu, x, keys()[2]), make_input(4097, 80),
                        keys()[2]);
}

// Three steps of residual feedback (codec_checks.cuh's `all_feedback`). With 16-bit values the
// gradients are scaled into the value type's range: a value that overflows to infinity would
// make the next step fail (on the CPU as here), and scaled random-k multiplies by n/k.
template <class CpuCodec, class CudaCodec>
void sparse_feedback(CpuCodec const& cpu, CudaCodec const& gpu) {
  if (cpu.value_type() == gc::sparse_values::f32) {
    all_feedback(cpu, gpu, finite_specials());
  } else {
    all_feedback(cpu, gpu, {}, 1e-7f);
  }
}

}  // namespace gct

#define GCT_SPARSE_CASES(family, tag)                                                    \
  TEST_CASE(GCT_BACKEND ": " #family " writes the CPU codec's packets", "[cuda]" tag) {  \
    bool first = true;                                                                   \
    gct::for_each_##family([&](char const* name, auto const& cpu, auto const& gpu) {     \
      INFO(name);                                                                        \
      gct::sparse_packets(cpu, gpu, first);                                              \
      first = false;                                                                     \
    });                                                                                  \
  }                                                                                      \
  TEST_CASE(GCT_BACKEND ": " #family " decodes like the CPU codec", "[cuda]" tag) {      \
    gct::for_each_##family([](char const* name, auto const& cpu, auto const& gpu) {      \
      INFO(name);                                                                        \
      gct::sparse_decoding(cpu, gpu);                                                    \
    });                                                                                  \
  }                                                                                      \
  TEST_CASE(GCT_BACKEND ": " #family " fuses error feedback like residual_feedback",     \
            "[cuda][feedback]" tag) {                                                    \
    gct::for_each_##family([](char const* name, auto const& cpu, auto const& gpu) {      \
      INFO(name);                                                                        \
      gct::sparse_feedback(cpu, gpu);                                                    \
      gct::feedback_errors(cpu, gpu, true);                                              \
    });                                                                                  \
  }                                                                                      \
  TEST_CASE(GCT_BACKEND ": " #family " workspace and malformed headers", "[cuda]" tag) { \
    gct::for_each_##family([](char const* name, auto const& cpu, auto const& gpu) {      \
      INFO(name);                                                                        \
      gct::check_workspace(cpu, gpu, 0);                                                 \
      gct::check_workspace(cpu, gpu, 8197);                                              \
      std::vector<std::byte> const good = gct::cpu_compress(cpu, gct::make_input(300, 5)); \
      if (good.size() > gc::header_bytes) gct::check_header_rejections(cpu, gpu, good, 300); \
    });                                                                                  \
  }

GCT_SPARSE_CASES(topk, "[topk]")
GCT_SPARSE_CASES(threshold, "[threshold]")
GCT_SPARSE_CASES(randomk, "[randomk]")

#undef GCT_SPARSE_CASES

TEST_CASE(GCT_BACKEND ": top-k and threshold reject non-finite inputs like the CPU codecs",
          "[cuda][topk][threshold]") {
  gct::for_each_topk([](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    gct::nonfinite_inputs(cpu, gpu);
  });
  gct::for_each_threshold([](char const* name, auto const& cpu, auto const& gpu) {
    INFO(name);
    gct::nonfinite_inputs(cpu, gpu);
  });
  // random-k looks at the chosen coordinates only and sends what it finds, as on the CPU.
  std::vector<float> x = gct::make_input(4097, 3);
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = std::numeric_limits<float>::infinity();
  x[1] = std::numeric_limits<float>::quiet_NaN();
  gct::require_same_packets(gc::random_k_codec::ratio(0.5), gc::cuda::random_k_codec::ratio(0.5),
                            x, true, false);
}

TEST_CASE(GCT_BACKEND ": top-k breaks ties toward the lower index, as the CPU codec",
          "[cuda][topk]") {
  // Every element ties: the first k indices are selected.
  std::vector<float> x(1000, 2.0f);
  for (std::size_t i = 0; i < x.size(); i += 2) x[i] = -2.0f;
  std::vector<std::byte> const packet = gct::cuda_compress(gc::cuda::topk_codec::count(10), x);
  std::vector<float> out(1000, 7.0f);
  gc::topk_codec::count(10).decompress(std::span<std::byte const>(packet), std::span<float>(out));
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == (i < 10 ? x[i] : 0.0f));
  // Above the tie: the larger ones, then the first ties.
  x[700] = 5.0f;
  x[300] = -4.0f;
  std::vector<std::byte> const p2 = gct::cuda_compress(gc::cuda::topk_codec::count(5), x);
  gc::topk_codec::count(5).decompress(std::span<std::byte const>(p2), std::span<float>(out));
  std::vector<std::size_t> nonzero;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] != 0.0f) nonzero.push_back(i);
  }
  CHECK(nonzero == std::vector<std::size_t>{0, 1, 2, 300, 700});
}

TEST_CASE(GCT_BACKEND ": sparse indices are checked like the CPU codecs do",
          "[cuda][topk][threshold]") {
  using bytes = std::vector<std::byte>;
  auto encoding = [](bytes const& p) { return static_cast<unsigned>(p[7]) >> 2; };
  // Absolute indices: two selected elements whose indices need 17 bits, where the delta
  // encoding would not be smaller.
  std::size_t const big = 100003;
  std::vector<float> y = gct::make_input(big, 14);
  for (float& v : y) v = std::fmod(v, 1.0f);
  y[70000] = 5.0f;
  y[90000] = -6.0f;
  gc::topk_codec const cpu = gc::topk_codec::count(2);
  gc::cuda::topk_codec const gpu = gc::cuda::topk_codec::count(2);
  bytes const absolute = gct::cpu_compress(cpu, y);
  REQUIRE(encoding(absolute) == 0);
  GCT_REQUIRE_SAME_PACKET(absolute, gct::cuda_compress(gpu, y));
  std::size_t const at = gc::header_bytes;
  // An index at n, a repeated index, a descending pair, the last one far out of range.
  gct::require_same_rejection(cpu, gpu, gct::edited(absolute, [&](bytes& p) { gct::put_u32(p, at, big); }), big);
  gct::require_same_rejection(cpu, gpu, gct::edited(absolute, [&](bytes& p) {
                                gct::put_u32(p, at + 4, 70000);
                              }), big);
  gct::require_same_rejection(cpu, gpu, gct::edited(absolute, [&](bytes& p) {
                                gct::put_u32(p, at, 90000);
                                gct::put_u32(p, at + 4, 70000);
                              }), big);
  gct::require_same_rejection(cpu, gpu, gct::edited(absolute, [&](bytes& p) {
                                gct::put_u32(p, at + 4, 0xffffffffu);
                              }), big);

  std::size_t const n = 4097;
  std::vector<float> const x = gct::make_input(n, 13);
  gc::topk_codec const dense_cpu = gc::topk_codec::count(2049);
  gc::cuda::topk_codec const dense_gpu = gc::cuda::topk_codec::count(2049);
  bytes const delta = gct::cpu_compress(dense_cpu, x);
  REQUIRE(encoding(delta) == 1);
  unsigned const b = static_cast<unsigned>(delta[28]);
  std::size_t const m = static_cast<std::size_t>(delta[24]) | (static_cast<std::size_t>(delta[25]) << 8);
  std::size_t const ib = (m * b + 31) / 32 * 4;
  // Gaps that run past n (all bits of the first entries set), and padding bits.
  gct::require_same_rejection(dense_cpu, dense_gpu, gct::edited(delta, [&](bytes& p) {
                                for (int k = 0; k < 8; ++k) p[at + k] = std::byte{0xff};
                              }), n);
  gct::require_same_rejection(dense_cpu, dense_gpu, gct::edited(delta, [&](bytes& p) {
                                p[at + ib - 1] |= std::byte{0x80};
                              }), n);
  REQUIRE(m * b % 32 != 0);  // this input's section has padding bits
  gct::require_same_rejection(dense_cpu, dense_gpu, gct::edited(delta, [&](bytes& p) {
                                p[at + (m * b) / 8] |= static_cast<std::byte>(0x80u);
                              }), n);
  gct::require_same_decoding(dense_cpu, dense_gpu, delta, gct::make_input(n, 2));
}

TEST_CASE(GCT_BACKEND ": random-k checks the decoder's seed and step like the CPU codec",
          "[cuda][randomk]") {
  std::size_t const n = 5000;
  gc::random_stream const sender{0x1234, 9, 4};
  gc::scaled_random_k_codec const cpu = gc::scaled_random_k_codec::ratio(0.1);
  gc::cuda::scaled_random_k_codec const gpu = gc::cuda::scaled_random_k_codec::ratio(0.1);
  std::vector<std::byte> const packet = gct::cpu_compress(cpu, gct::make_input(n, 6), sender);
  gct::require_same_decoding(cpu, gpu, packet, gct::make_input(n, 7), sender);
  for (gc::random_stream const& other : {gc::random_stream{0x1235, 9, 4}, gc::random_stream{0x1234, 8, 4}}) {
    std::vector<float> const init(n, 1.0f);
    std::string const expected =
        gct::thrown_by([&] { (void)gct::cpu_decode(cpu, packet, init, false, 1.0f, other); });
    REQUIRE(expected.rfind("format_error: gradcomp: random_k packet", 0) == 0);
    CHECK(gct::thrown_by([&] { (void)gct::cuda_decode(gpu, packet, init, true, 1.0f, other); }) ==
          expected);
  }
}
