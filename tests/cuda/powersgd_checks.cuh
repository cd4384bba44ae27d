// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// PowerSGD's cases shared by the two CUDA test programs (included by codec_checks.cuh): the
// device state and the CPU's `powersgd` (built-in GEMM) run the same steps, live; packets,
// residuals and decoded matrices must be identical to the bit, errors the same.

#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/cuda/powersgd.cuh>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace gct {

struct psgd_shape {
  std::size_t rows, cols;
  std::uint32_t rank;
  std::uint64_t min_elements;
};

inline std::vector<psgd_shape> const& psgd_shapes() {
  static std::vector<psgd_shape> const s = {
      {64, 128, 4, 64}, {100, 37, 2, 64}, {33, 700, 1, 64}, {130, 130, 3, 4096},
      {17, 2000, 5, 64}, {5, 5, 2, 64} /* dense: r (rows + cols) >= rows cols */,
      {1, 5000, 4, 64} /* dense */, {40, 40, 2, 4096} /* dense: under min_elements */};
  return s;
}

inline gc::powersgd_options cpu_psgd_options(psgd_shape const& s, bool feedback) {
  gc::powersgd_options o;
  o.rank = s.rank;
  o.min_elements = s.min_elements;
  o.backend = gc::cpu::gemm_backend::builtin;
  o.error_feedback = feedback;
  return o;
}

inline gc::cuda::powersgd_options cuda_psgd_options(psgd_shape const& s, bool feedback) {
  gc::cuda::powersgd_options o;
  o.rank = s.rank;
  o.min_elements = s.min_elements;
  o.error_feedback = feedback;
  return o;
}

// Three steps of gradients of type T: packets and residuals identical; each packet decoded
// into every output type identically.
template <gc::element T>
void require_same_powersgd(psgd_shape const& s, bool feedback, std::uint64_t seed) {
  INFO(s.rows << " x " << s.cols << " rank " << s.rank << ", input " << type_name<T>()
               << (feedback ? "" : ", no feedback"));
  gc::tensor_id const id{6};
  gc::powersgd cpu(cpu_psgd_options(s, feedback));
  gc::cuda::powersgd_state gpu(s.rows, s.cols, cuda_psgd_options(s, feedback), id);
  std::size_t const n = s.rows * s.cols;
  for (std::uint32_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    gc::random_stream const rs{seed, step, 6};
    std::vector<T> const g = convert<T>(make_input(n, seed + step), true);
    std::vector<std::byte> cpu_packet(cpu.max_compressed_bytes(s.rows, s.cols));
    cpu_packet.resize(cpu.compress(gc::tensor_view<T const>(std::span<T const>(g), id), s.rows,
                                   s.cols, std::span<std::byte>(cpu_packet), cpu_context(rs)));
    buffer<T> const dg(g);
    buffer<std::byte> out(gpu.packet_bytes());
    std::size_t const size = gpu.compress(dg.get(), out.get(), nullptr, rs);
    GCT_REQUIRE_SAME_PACKET(cpu_packet, out.download(size));
    buffer<float> res(n);
    gpu.residual(res.get());
    std::vector<float> const want = cpu.find(id)->residual(cpu_context(rs));
    REQUIRE(same_elements(want, res.download(), true));
    for_each_element_type([&](auto t) {
      using U = decltype(t);
      std::vector<U> const init = convert<U>(make_input(n, 77 + step));
      for (float alpha : {1.0f, -0.5f}) {
        std::vector<U> a = init, b = init;
        gc::powersgd::decompress_add(std::span<std::byte const>(cpu_packet), std::span<U>(a), alpha);
        buffer<std::byte> const p(cpu_packet);
        buffer<U> d(init);
        gc::cuda::powersgd_state::decompress_add(p.get(), cpu_packet.size(), d.get(), n, alpha);
        CHECK(same_elements(a, d.download(), false));
        gc::powersgd::decompress(std::span<std::byte const>(cpu_packet), std::span<U>(b));
        gc::cuda::powersgd_state::decompress(p.get(), cpu_packet.size(), d.get(), n);
        CHECK(same_elements(b, d.download(), true));
      }
    });
  }
}

}  // namespace gct

TEST_CASE(GCT_BACKEND ": PowerSGD writes the CPU's packets and keeps its residual",
          "[cuda][powersgd]") {
  for (gct::psgd_shape const& s : gct::psgd_shapes()) {
    gct::require_same_powersgd<float>(s, true, 1000 + s.rows);
    gct::require_same_powersgd<gc::half>(s, true, 2000 + s.rows);
    gct::require_same_powersgd<gc::bfloat16>(s, false, 3000 + s.rows);
  }
}

TEST_CASE(GCT_BACKEND ": PowerSGD refuses what the CPU refuses", "[cuda][powersgd]") {
  gct::psgd_shape const s{50, 60, 3, 64};
  std::size_t const n = s.rows * s.cols;
  gc::tensor_id const id{2};
  gc::powersgd cpu(gct::cpu_psgd_options(s, true));
  gc::cuda::powersgd_state gpu(s.rows, s.cols, gct::cuda_psgd_options(s, true), id);
  std::vector<float> g = gct::make_input(n, 5);
  g[1234] = std::numeric_limits<float>::quiet_NaN();
  g[2000] = std::numeric_limits<float>::infinity();
  std::vector<std::byte> cpu_out(cpu.max_compressed_bytes(s.rows, s.cols));
  std::string const expected = gct::thrown_by([&] {
    (void)cpu.compress(gc::tensor_view<float const>(std::span<float const>(g), id), s.rows, s.cols,
                       std::span<std::byte>(cpu_out), gct::cpu_context({1, 0, 2}));
  });
  REQUIRE(expected.rfind("numeric_error: gradcomp: powersgd cannot compress", 0) == 0);
  gct::buffer<float> const dg(g);
  gct::buffer<std::byte> out(gpu.packet_bytes());
  CHECK(gct::thrown_by([&] { (void)gpu.compress(dg.get(), out.get(), nullptr, {1, 0, 2}); }) ==
        expected);
  CHECK_FALSE(gpu.has_result());

  // Malformed packets: the CPU's messages; the output untouched.
  using bytes = std::vector<std::byte>;
  std::vector<float> const x = gct::make_input(n, 6);
  bytes good(cpu.max_compressed_bytes(s.rows, s.cols));
  good.resize(cpu.compress(gc::tensor_view<float const>(std::span<float const>(x), id), s.rows,
                           s.cols, std::span<std::byte>(good), gct::cpu_context({1, 0, 2})));
  auto rejects = [&](bytes const& packet, std::size_t count) {
    std::vector<float> const init(count, 42.0f);
    std::vector<float> a = init;
    std::string const want = gct::thrown_by([&] {
      gc::powersgd::decompress(std::span<std::byte const>(packet), std::span<float>(a));
    });
    INFO("CPU: " << want);
    REQUIRE(want != "none");
    gct::buffer<std::byte> const p(packet);
    gct::buffer<float> d(init);
    CHECK(gct::thrown_by([&] {
            gc::cuda::powersgd_state::decompress(p.get(), packet.size(), d.get(), count);
          }) == want);
    CHECK(d.download() == init);
  };
  rejects(bytes(good.begin(), good.begin() + 20), n);
  rejects(bytes(good.begin(), good.end() - 4), n);
  rejects(gct::edited(good, [](bytes& p) { p[5] = std::byte{3}; }), n);
  rejects(gct::edited(good, [](bytes& p) { p[7] = std::byte{2}; }), n);
  rejects(gct::edited(good, [](bytes& p) { gct::put_u32(p, 24, 7); }), n);
  rejects(gct::edited(good, [](bytes& p) { gct::put_u32(p, 28, 0); }), n);
  rejects(gct::edited(good, [](bytes& p) { gct::put_u32(p, 100, 0x7fc00000u); }), n);
  rejects(good, n + 1);
}
