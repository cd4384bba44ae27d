// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// approx_topk: the selected count lies in the tolerance window, the selection is the exact
// top-m for its own m (so its energy is at least (1 - tol) of exact top-k's) on several
// distributions; tolerance 0 is exact top-k; packets do not depend on threads or ISA; golden
// packet; malformed input and bad parameters raise. Whole-model selection over a list of
// tensors equals top-k of their concatenation.

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/approx_topk.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/codec/whole_model.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace {

using namespace gradcomp_test;
namespace gc = gradcomp;

/// Reference: stable sort by |x| descending (ties: lower index first), first k, ascending.
std::vector<std::uint32_t> reference_top(std::vector<float> const& x, std::size_t k) {
  std::vector<std::uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<std::uint32_t> packet_indices(std::span<std::byte const> p) {
  auto const h = gc::read_header(p);
  std::vector<std::uint32_t> idx;
  gc::detail::sparse::read_indices(h, p.data() + hdr, idx);
  return idx;
}

double energy(std::vector<float> const& x, std::vector<std::uint32_t> const& idx) {
  double e = 0;
  for (auto i : idx) e += static_cast<double>(x[i]) * x[i];
  return e;
}

/// The test distributions: Gaussian, heavy-tailed, many ties, constant, zeros, a periodic
/// pattern that misleads a strided sample, a sorted ramp.
std::vector<std::pair<char const*, std::vector<float>>> distributions(std::size_t n,
                                                                      std::uint64_t seed) {
  std::vector<std::pair<char const*, std::vector<float>>> d;
  d.emplace_back("gaussian", gaussian(n, seed));
  d.emplace_back("heavy-tailed", heavy_tailed(n, seed + 1));
  auto ties = gaussian(n, seed + 2);
  for (auto& v : ties) v = std::round(v * 2.0f) / 2.0f;
  d.emplace_back("ties", ties);
  d.emplace_back("constant", std::vector<float>(n, -0.5f));
  d.emplace_back("zeros", std::vector<float>(n, 0.0f));
  // Large values exactly at the positions the default sample reads (every `step`-th element
  // from step / 2 on): the sample overestimates the threshold, the fallback must step in.
  auto periodic = gaussian(n, seed + 3);
  std::size_t const step =
      n / std::max<std::size_t>(
              4096, static_cast<std::size_t>(std::ceil(0.001 * static_cast<double>(n))));
  for (std::size_t i = 0; i < n; ++i) {
    if (step < 2 || i % step != step / 2) periodic[i] *= 1e-3f;
  }
  d.emplace_back("periodic", periodic);
  std::vector<float> ramp(n);
  for (std::size_t i = 0; i < n; ++i) ramp[i] = static_cast<float>(i) * 1e-3f;
  d.emplace_back("ramp", ramp);
  return d;
}

}  // namespace

static_assert(gc::codec<gc::approx_topk_codec>);

TEST_CASE("approx_topk: count within tolerance, exact top-m, energy within (1 - tol) of top-k",
          "[codec][approx_topk]") {
  for (std::size_t n : {0u, 1u, 2u, 100u, 5000u, 70001u, quick_mode() ? 70002u : 1u << 18}) {
    for (auto const& [name, x_] : distributions(n, n + 5)) {
      auto const& x = x_;  // lambdas below capture it (Clang 14 cannot capture a binding)
      // The reference order once per input: |x| descending, ties by index.
      std::vector<std::uint32_t> order(n);
      std::iota(order.begin(), order.end(), 0u);
      std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
        return std::fabs(x[a]) > std::fabs(x[b]);
      });
      auto top = [&](std::size_t m) {
        std::vector<std::uint32_t> r(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m));
        std::sort(r.begin(), r.end());
        return r;
      };
      for (std::size_t k :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, n / 1000, n / 100, n / 10, n / 2, n}) {
        for (double tol : {0.0, 0.1, 0.3}) {
          CAPTURE(name, n, k, tol);
          gc::approx_topk_codec const c = gc::approx_topk_codec::count(k, 0.001, tol);
          auto const p = compress(c, x, serial_ctx());
          auto const idx = packet_indices(p);
          std::size_t const m = idx.size();
          std::size_t const kk = std::min(k, n);
          auto const [lo, hi] = c.window(kk);
          REQUIRE(m >= lo);
          REQUIRE(m <= hi);
          REQUIRE(static_cast<double>(m) >=
                  std::ceil((1.0 - tol) * static_cast<double>(kk) - 1e-9));
          REQUIRE(static_cast<double>(m) <=
                  std::floor((1.0 + tol) * static_cast<double>(kk) + 1e-9));
          REQUIRE(m == kk);  // one tensor: the exact top-k, inside every window
          REQUIRE(idx == top(m));
          REQUIRE(energy(x, idx) >= (1.0 - tol) * energy(x, top(kk)) * (1.0 - 1e-12));
        }
      }
    }
  }
}

TEST_CASE("approx_topk with tolerance 0 writes top-k's packet; threads and ISA do not matter",
          "[codec][approx_topk]") {
  for (std::size_t n : {1000u, 200000u, 300001u}) {
    auto const x = heavy_tailed(n, 12);
    for (std::size_t k : {n / 1000, n / 100}) {
      auto const exact =
          compress(gc::topk_codec::count(k, gc::sparse_values::bf16), x, serial_ctx());
      auto p = compress(gc::approx_topk_codec::count(k, 0.01, 0.0, gc::sparse_values::bf16), x,
                        serial_ctx());
      put_u8(p, field::codec, static_cast<unsigned>(gc::codec_id::topk));
      REQUIRE(p == exact);
      gc::approx_topk_codec const c = gc::approx_topk_codec::count(k, 0.002, 0.1);
      auto const ref = compress(c, x, serial_ctx(gc::cpu::isa::scalar));
      for (unsigned t : {1u, 2u, 3u}) {
        for (auto level : isa_levels) REQUIRE(compress(c, x, parallel_ctx(t, level)) == ref);
      }
    }
  }
}

TEST_CASE("approx_topk: sample fractions and value types round-trip", "[codec][approx_topk]") {
  std::size_t const n = 100000;
  auto const x = gaussian(n, 31);
  for (double sample : {1e-6, 0.001, 0.05, 1.0}) {
    for (auto v : {gc::sparse_values::f32, gc::sparse_values::f16}) {
      gc::approx_topk_codec const c = gc::approx_topk_codec::ratio(0.01, sample, 0.1, v);
      CAPTURE(sample);
      auto const p = compress(c, x, serial_ctx());
      auto const h = gc::approx_topk_codec::inspect(p);
      REQUIRE(h.codec == gc::codec_id::approx_topk);
      auto const idx = packet_indices(p);
      REQUIRE(idx.size() >= 900);
      REQUIRE(idx.size() <= 1100);
      auto const y = decompress<float>(c, p, n);
      std::vector<float> z(n);
      gc::decompress_any<float>(p, z);
      REQUIRE(z == y);
      std::size_t j = 0;
      for (std::size_t i = 0; i < n; ++i) {
        bool const sel = j < idx.size() && idx[j] == i;
        float const want = !sel                          ? 0.0f
                           : v == gc::sparse_values::f32 ? x[i]
                                                         : gc::to_float(gc::half(x[i]));
        if (sel) ++j;
        REQUIRE(bits_of(y[i]) == bits_of(want));
      }
    }
  }
}

TEST_CASE("approx_topk golden packet", "[codec][approx_topk][golden]") {
  std::vector<float> const x = {0.5f, -2.0f, 0.0f, 1.0f, 3.0f, 0.0f, 0.0f, -1.0f};
  // k = 3, tolerance 0.5: the window is [2, 4]. A single tensor gets the exact top 3 (inside
  // every window; approx_topk.hpp): top-k's golden packet with the approx_topk id, whatever
  // the tolerance.
  auto const p = compress(gc::approx_topk_codec::count(3, 0.001, 0.5), x);
  CHECK(to_hex(p) ==
        "4743504b020d0104"
        "0800000000000000"
        "1000000000000000"
        "0300000001000000"
        "03000000"
        "000000c0"
        "0000803f"
        "00004040");
  // Tolerance 0: the same.
  auto const q = compress(gc::approx_topk_codec::count(3, 0.001, 0.0), x);
  CHECK(to_hex(q) ==
        "4743504b020d0104"
        "0800000000000000"
        "1000000000000000"
        "0300000001000000"
        "03000000"
        "000000c0"
        "0000803f"
        "00004040");
}

TEST_CASE("approx_topk parameters, specs and non-finite input", "[codec][approx_topk]") {
  CHECK_THROWS_AS(gc::approx_topk_codec::ratio(0.0), gc::config_error);
  CHECK_THROWS_AS(gc::approx_topk_codec::ratio(2.0), gc::config_error);
  CHECK_THROWS_AS(gc::approx_topk_codec::ratio(0.01, 0.0), gc::config_error);
  CHECK_THROWS_AS(gc::approx_topk_codec::ratio(0.01, 1.5), gc::config_error);
  CHECK_THROWS_AS(gc::approx_topk_codec::ratio(0.01, 0.01, -0.1), gc::config_error);
  CHECK_THROWS_AS(gc::approx_topk_codec::ratio(0.01, 0.01, 1.0), gc::config_error);
  CHECK_THROWS_AS(gc::approx_topk_codec::count(5, 0.01, 0.1, static_cast<gc::sparse_values>(3)),
                  gc::config_error);
  gc::approx_topk_codec const d;
  CHECK(d.ratio_value() == 0.01);
  CHECK(d.tolerance() == 0.1);
  CHECK(d.window(1000) == std::pair<std::uint64_t, std::uint64_t>{900, 1100});
  CHECK(d.window(1) == std::pair<std::uint64_t, std::uint64_t>{1, 1});
  CHECK(d.max_compressed_bytes(100000) == 32 + 1100 * 8);
  auto const a = gc::make_codec("approx_topk:ratio=0.01,sample=0.01,tolerance=0.2,values=bf16");
  CHECK(a.id() == gc::codec_id::approx_topk);
  CHECK(a.bits_per_element() == Approx(0.48));
  auto const x = gaussian(50000, 3);
  CHECK(compress(a, x) ==
        compress(gc::approx_topk_codec::ratio(0.01, 0.01, 0.2, gc::sparse_values::bf16), x));
  CHECK(compress(gc::make_codec("approx_topk:k=100"), x) ==
        compress(gc::approx_topk_codec::count(100), x));
  CHECK_THROWS_AS(gc::make_codec("approx_topk:k=1,ratio=0.1"), gc::config_error);
  CHECK_THROWS_AS(gc::make_codec("approx_topk:sample=x"), gc::config_error);
  for (float bad : {std::nanf(""), INFINITY}) {
    for (std::size_t k : {std::size_t{0}, std::size_t{10}, std::size_t{40000}}) {
      auto y = gaussian(200000, 5);
      y[123457] = bad;
      y[150000] = bad;
      std::string msg;
      try {
        (void)compress(gc::approx_topk_codec::count(k), y, parallel_ctx(3));
      } catch (gc::numeric_error const& e) {
        msg = e.what();
      }
      CAPTURE(k);
      CHECK(msg.find("123457") != std::string::npos);
    }
  }
  // Malformed packets are rejected by the shared sparse decoder (unsorted, duplicate, range).
  auto abs_packet = [](std::vector<std::uint32_t> const& idx) {
    std::vector<std::byte> p(hdr + 8 * idx.size());
    gc::write_header(p, {gc::codec_id::approx_topk, gc::dtype::f32, 0, 300, 8 * idx.size(),
                         static_cast<std::uint32_t>(idx.size()), 0});
    for (std::size_t i = 0; i < idx.size(); ++i) put_u32(p, hdr + 4 * i, idx[i]);
    return p;
  };
  std::vector<float> out(300);
  gc::approx_topk_codec const c;
  CHECK_NOTHROW(
      c.decompress(std::span<std::byte const>(abs_packet({0, 5, 299})), std::span<float>(out)));
  for (auto const& bad : {std::vector<std::uint32_t>{5, 0, 299}, {0, 5, 5}, {0, 5, 300}}) {
    CHECK_THROWS_AS(
        c.decompress(std::span<std::byte const>(abs_packet(bad)), std::span<float>(out)),
        gc::format_error);
  }
}

TEST_CASE("whole-model top-k equals top-k of the concatenated tensors", "[codec][whole_model]") {
  // Tensors of different sizes and scales (one empty, one tiny), some values tied across
  // tensors: ties go to the earlier tensor.
  std::vector<std::vector<float>> ts = {
      gaussian(3000, 1), {}, heavy_tailed(20000, 2), gaussian(7, 3), gaussian(70000, 4, 0.1)};
  ts[0][17] = 2.5f;
  ts[2][5] = -2.5f;
  ts[3][1] = 2.5f;
  for (auto& v : ts[4]) v = std::round(v * 40.0f) / 40.0f;  // many ties
  std::vector<float> all;
  for (auto const& t : ts) all.insert(all.end(), t.begin(), t.end());
  std::vector<gc::tensor_view<float const>> views;
  for (std::size_t t = 0; t < ts.size(); ++t)
    views.emplace_back(std::span<float const>(ts[t]), gc::tensor_id{static_cast<std::uint32_t>(t)});
  auto split = [&](std::vector<std::uint32_t> const& global) {
    std::vector<std::vector<std::uint32_t>> per(ts.size());
    for (auto g : global) {
      std::size_t t = 0, base = 0;
      while (g >= base + ts[t].size()) base += ts[t++].size();
      per[t].push_back(static_cast<std::uint32_t>(g - base));
    }
    return per;
  };
  for (std::size_t k :
       {std::size_t{1}, std::size_t{3}, std::size_t{500}, std::size_t{9300}, all.size()}) {
    CAPTURE(k);
    auto const exact = gc::select_whole_model(gc::topk_codec::count(k),
                                              std::span<gc::tensor_view<float const> const>(views));
    REQUIRE(exact.k == k);
    REQUIRE(exact.selected == k);
    REQUIRE(exact.indices == split(reference_top(all, k)));
    auto const approx = gc::select_whole_model(gc::approx_topk_codec::count(k, 0.001, 0.2),
                                               std::span<gc::tensor_view<float const> const>(views),
                                               parallel_ctx(2));
    auto const [lo, hi] = gc::approx_topk_codec::count(k, 0.001, 0.2).window(k);
    REQUIRE(approx.selected >= lo);
    REQUIRE(approx.selected <= hi);
    REQUIRE(approx.indices == split(reference_top(all, approx.selected)));
  }
  // One packet per tensor: each decodes (with the ordinary top-k decoder) to its share.
  gc::topk_codec const c = gc::topk_codec::ratio(0.02, gc::sparse_values::f16);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::span<std::byte>> outs;
  for (auto const& t : ts) bufs.emplace_back(gc::whole_model_max_bytes(c, t.size(), all.size()));
  for (auto& b : bufs) outs.emplace_back(b);
  auto const sizes =
      gc::compress_whole_model(c, std::span<gc::tensor_view<float const> const>(views),
                               std::span<std::span<std::byte> const>(outs), serial_ctx());
  auto const want = split(reference_top(all, c.k_for(all.size())));
  for (std::size_t t = 0; t < ts.size(); ++t) {
    CAPTURE(t);
    std::span<std::byte const> const p(bufs[t].data(), sizes[t]);
    REQUIRE(packet_indices(p) == want[t]);
    auto const y = decompress<float>(c, p, ts[t].size());
    for (auto i : want[t]) REQUIRE(bits_of(y[i]) == bits_of(gc::to_float(gc::half(ts[t][i]))));
  }
  // Buffer and list mismatches are configuration errors.
  outs.pop_back();
  CHECK_THROWS_AS(gc::compress_whole_model(c, std::span<gc::tensor_view<float const> const>(views),
                                           std::span<std::span<std::byte> const>(outs)),
                  gc::config_error);
  outs.emplace_back(bufs.back());
  std::vector<std::byte> tiny(40);  // tensor 0 keeps some of its 3000 N(0, 1) values
  outs[0] = std::span<std::byte>(tiny);
  CHECK_THROWS_AS(gc::compress_whole_model(c, std::span<gc::tensor_view<float const> const>(views),
                                           std::span<std::span<std::byte> const>(outs)),
                  gc::config_error);
  // 16-bit tensors: the same selection as their float values.
  std::vector<std::vector<gc::bfloat16>> tb;
  std::vector<std::vector<float>> tf;
  for (auto const& t : ts) {
    tb.push_back(convert_to<gc::bfloat16>(t));
    std::vector<float> f(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) f[i] = gc::to_float(tb.back()[i]);
    tf.push_back(f);
  }
  std::vector<gc::tensor_view<gc::bfloat16 const>> vb;
  std::vector<gc::tensor_view<float const>> vf;
  for (std::size_t t = 0; t < ts.size(); ++t) {
    vb.emplace_back(std::span<gc::bfloat16 const>(tb[t]));
    vf.emplace_back(std::span<float const>(tf[t]));
  }
  CHECK(gc::select_whole_model(gc::topk_codec::count(800),
                               std::span<gc::tensor_view<gc::bfloat16 const> const>(vb))
            .indices == gc::select_whole_model(gc::topk_codec::count(800),
                                               std::span<gc::tensor_view<float const> const>(vf))
                            .indices);
}
