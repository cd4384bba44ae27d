// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0

#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include <catch2/catch.hpp>

#include "collective_support.hpp"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

using namespace gradcomp_test;
using gc::all_reduce_compressed;
using gc::in_process_communicator;
using gc::run_in_process;

namespace {

// Specs covering the summable, shared-support and gather families (low-rank: below).
std::vector<std::string> const specs = {
    "identity", "fp16", "bf16", "int8:bucket=64", "int8:bucket=64,rounding=stochastic", "onebit",
    "onebit:scaling=none", "qsgd:levels=7,bucket=128", "terngrad:bucket=64", "natural:bucket=64",
    "dithering:levels=3,partition=natural,norm=l2,bucket=64", "topk:ratio=0.05", "topk:k=3",
    "topk:ratio=0.1,values=bf16", "threshold:value=0.001", "approx_topk:ratio=0.05",
    "randomk:ratio=0.1", "randomk:k=5,scale=true", "randomk:ratio=0.2,values=bf16"};

// Per-rank context: gather codecs get different seeds on different ranks (independent noise),
// summable ones the same.
gc::codec_context rank_ctx(int rank, int step, bool same_seed) {
  gc::codec_context c;
  c.seed = same_seed ? 42 : 42 + static_cast<std::uint64_t>(rank);
  c.step = static_cast<std::uint32_t>(step);
  return c;
}

struct scenario {
  std::string spec;
  int ranks = 1;
  std::size_t n = 0;
  int steps = 1;
  bool feedback = false;
  int silent = -1;  // rank that contributes nothing (empty gradient), -1 none
  gc::reduction op = gc::reduction::sum;
};

// Reference: every rank's packet (from its own compressor, simulated here), decompressed and
// summed densely in float in rank order; `bound` gets sum_r |x̂_r| for tolerances.
std::vector<std::vector<float>> reference(scenario const& s, std::vector<std::vector<float>>& bound) {
  gc::any_codec const codec = gc::make_codec(s.spec);
  bool const same = codec.aggregation() != gc::aggregation_kind::gather;
  std::vector<gc::compressor<gc::any_codec>> comps(static_cast<std::size_t>(s.ranks), gc::compressor<gc::any_codec>(codec));
  std::vector<std::vector<float>> out;
  bound.clear();
  float const alpha = s.op == gc::reduction::average ? 1.0f / static_cast<float>(s.ranks) : 1.0f;
  for (int step = 0; step < s.steps; ++step) {
    std::vector<float> sum(s.n, 0.0f), b(s.n, 0.0f);
    for (int r = 0; r < s.ranks; ++r) {
      if (r == s.silent) continue;
      std::vector<float> const g = rank_gradient(s.n, r, step);
      gc::codec_context const ctx = rank_ctx(r, step, same);
      std::vector<std::byte> pkt(codec.max_compressed_bytes(s.n));
      gc::tensor_view<float const> v{std::span<float const>(g), gc::tensor_id{3}};
      std::size_t const bytes = s.feedback ? comps[static_cast<std::size_t>(r)].compress(v, std::span<std::byte>(pkt), ctx)
                                           : codec.compress(v, std::span<std::byte>(pkt), ctx);
      pkt.resize(bytes);
      codec.decompress_add(std::span<std::byte const>(pkt), std::span<float>(sum), alpha, ctx);
      std::vector<float> x(s.n);
      codec.decompress(std::span<std::byte const>(pkt), std::span<float>(x), ctx);
      for (std::size_t i = 0; i < s.n; ++i) b[i] += std::fabs(x[i]);
    }
    out.push_back(std::move(sum));
    bound.push_back(std::move(b));
  }
  return out;
}

// Runs the scenario on in-process ranks; returns each step's output of every rank.
std::vector<std::vector<std::vector<float>>> run(scenario const& s, std::vector<gc::collective_result>* results = nullptr) {
  gc::any_codec const codec = gc::make_codec(s.spec);
  bool const same = codec.aggregation() != gc::aggregation_kind::gather;
  std::vector<std::vector<std::vector<float>>> outs(static_cast<std::size_t>(s.ranks));
  if (results) results->assign(static_cast<std::size_t>(s.ranks), {});
  run_in_process(s.ranks, [&](in_process_communicator& comm) {
    int const r = comm.rank();
    gc::compressor<gc::any_codec> comp(codec);
    for (int step = 0; step < s.steps; ++step) {
      std::vector<float> g = r == s.silent ? std::vector<float>{} : rank_gradient(s.n, r, step);
      std::vector<float> out(s.n, -1.0f);
      gc::tensor_view<float const> v{std::span<float const>(g), gc::tensor_id{3}};
      gc::collective_options opt;
      opt.op = s.op;
      gc::collective_result const res = s.feedback
          ? all_reduce_compressed(comm, comp, v, std::span<float>(out), rank_ctx(r, step, same), opt)
          : all_reduce_compressed(comm, codec, v, std::span<float>(out), rank_ctx(r, step, same), opt);
      if (results) (*results)[static_cast<std::size_t>(r)] = res;
      outs[static_cast<std::size_t>(r)].push_back(std::move(out));
    }
  });
  return outs;
}

void check_scenario(scenario const& s) {
  CAPTURE(s.spec, s.ranks, s.n, s.steps, s.feedback, s.silent, static_cast<int>(s.op));
  std::vector<std::vector<float>> bound;
  auto const ref = reference(s, bound);
  std::vector<std::vector<std::vector<float>>> got;
  REQUIRE_NOTHROW(got = run(s));
  gc::any_codec const codec = gc::make_codec(s.spec);
  for (int step = 0; step < s.steps; ++step) {
    for (int r = 0; r < s.ranks; ++r) {
      auto const& o = got[static_cast<std::size_t>(r)][static_cast<std::size_t>(step)];
      // Every rank holds the same bits.
      REQUIRE(o == got[0][static_cast<std::size_t>(step)]);
    }
    auto const& o = got[0][static_cast<std::size_t>(step)];
    auto const& e = ref[static_cast<std::size_t>(step)];
    if (codec.aggregation() == gc::aggregation_kind::gather) {
      REQUIRE(o == e);  // same decompress-add order: bit-identical
    } else {
      // Summed in the compressed domain: one rounding of the wire type per peer (identity:
      // float, exact in rank order up to the averaging scale).
      bool const bf16_values = codec.id() == gc::codec_id::bf16 || s.spec.find("values=bf16") != std::string::npos;
      double const u = codec.id() == gc::codec_id::fp16 ? 0x1p-11 : bf16_values ? 0x1p-8 : 0x1p-24;
      REQUIRE(close(o, e, bound[static_cast<std::size_t>(step)], (s.ranks + 1) * u));
    }
  }
}

}  // namespace

TEST_CASE("all_reduce_compressed matches decompress-and-sum for every codec family", "[collective]") {
  for (auto const& spec : specs) {
    for (int w : {1, 2, 3, 5, 8}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{4099}}) {
        if (w == 8 && n == 4099) continue;
        scenario s{spec, w, n, 1, false, -1, gc::reduction::sum};
        check_scenario(s);
      }
    }
  }
}

TEST_CASE("all_reduce_compressed with error feedback over several steps, averaging", "[collective]") {
  for (auto const& spec : specs) {
    for (int w : {2, 4}) {
      scenario s{spec, w, 2001, 3, true, -1, gc::reduction::average};
      check_scenario(s);
    }
  }
}

TEST_CASE("all_reduce_compressed: empty tensors and a rank contributing nothing", "[collective]") {
  for (auto const& spec : specs) {
    scenario empty{spec, 3, 0, 1, false, -1, gc::reduction::sum};
    check_scenario(empty);
    scenario silent{spec, 4, 777, 2, true, 2, gc::reduction::sum};
    check_scenario(silent);
    scenario only_one{spec, 2, 100, 1, false, 0, gc::reduction::average};
    check_scenario(only_one);
  }
}

TEST_CASE("all_reduce_compressed reports the path and the traffic", "[collective]") {
  std::vector<gc::collective_result> res;
  scenario s{"topk:k=10", 4, 1000, 1, false, 1, gc::reduction::sum};
  REQUIRE_NOTHROW(run(s, &res));
  std::size_t const topk_packet = compress(gc::make_codec("topk:k=10"), rank_gradient(1000, 0, 0)).size();
  for (int r = 0; r < 4; ++r) {
    REQUIRE(res[static_cast<std::size_t>(r)].path == gc::collective_path::gather);
    REQUIRE(res[static_cast<std::size_t>(r)].packet_bytes == (r == 1 ? 0 : topk_packet));
  }
  // Ring all-gather: rank 0 forwards every packet but rank 1's (empty) one; then the
  // step-outcome round (a ring all-reduce of three 4-byte words).
  std::size_t const outcome = gc::detail::outcome_wire_bytes(false, 4);
  REQUIRE(res[0].wire_bytes == 3 * gc::rank_report_bytes + 3 * topk_packet + outcome);
  scenario d{"fp16", 4, 1000, 1, false, -1, gc::reduction::sum};
  REQUIRE_NOTHROW(run(d, &res));
  REQUIRE(res[0].path == gc::collective_path::summable);
  REQUIRE(res[0].wire_bytes == 3 * gc::rank_report_bytes + 2 * 3 * 2000 / 4 + outcome);
}

TEST_CASE("dense baselines: f32 exact, 16-bit within the per-peer rounding bound", "[collective]") {
  for (auto f : {gc::dense_format::f32, gc::dense_format::f16, gc::dense_format::bf16}) {
    for (int w : {1, 2, 3, 8}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{3001}}) {
        CAPTURE(gc::dense_format_name(f), w, n);
        std::vector<std::vector<float>> got(static_cast<std::size_t>(w));
        REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
          std::vector<float> g = comm.rank() == 1 ? std::vector<float>{} : rank_gradient(n, comm.rank(), 0);
          std::vector<float> out(n);
          gc::collective_options opt;
          opt.op = gc::reduction::average;
          auto const res = gc::all_reduce_dense(comm, g, out, f, opt);
          RANK_REQUIRE(res.path == (f == gc::dense_format::f32 ? gc::collective_path::dense_f32
                                    : f == gc::dense_format::f16 ? gc::collective_path::dense_f16
                                                                 : gc::collective_path::dense_bf16));
          got[static_cast<std::size_t>(comm.rank())] = out;
        }));
        std::vector<float> e(n, 0.0f), b(n, 0.0f);
        for (int r = 0; r < w; ++r) {
          if (r == 1) continue;
          auto const g = rank_gradient(n, r, 0);
          for (std::size_t i = 0; i < n; ++i) {
            e[i] += g[i];
            b[i] += std::fabs(g[i]);
          }
        }
        for (std::size_t i = 0; i < n; ++i) {
          e[i] /= static_cast<float>(w);
          b[i] /= static_cast<float>(w);
        }
        double const u = f == gc::dense_format::f16 ? 0x1p-11 : f == gc::dense_format::bf16 ? 0x1p-8 : 0x1p-24;
        for (int r = 0; r < w; ++r) REQUIRE(got[static_cast<std::size_t>(r)] == got[0]);
        // f16 has subnormals below 6e-5: allow an absolute half-ulp of the smallest subnormal.
        REQUIRE(close(got[0], e, b, (w + 2) * u, f == gc::dense_format::f16 ? w * 0x1p-25 : 1e-30));
      }
    }
  }
}

TEST_CASE("dense f32 all-reduce in place sums exactly in rank order", "[collective]") {
  REQUIRE_NOTHROW(run_in_process(3, [](in_process_communicator& comm) {
    std::vector<float> g{1.0f * static_cast<float>(comm.rank()), 0.5f, -2.0f};
    gc::all_reduce_dense(comm, g, g);
    RANK_REQUIRE(g == std::vector<float>{3.0f, 1.5f, -6.0f});
  }));
}

TEST_CASE("shared-support codecs all-reduce the values at the shared support", "[collective]") {
  shared_stride_codec const codec(7);
  for (int w : {1, 2, 3, 6}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{50}, std::size_t{2003}}) {
      CAPTURE(w, n);
      gc::codec_context ctx;
      ctx.seed = 9;
      ctx.step = 4;
      std::vector<float> e(n, 0.0f);
      for (int r = 0; r < w; ++r) {
        if (r == w - 1 && w > 1) continue;  // the last rank contributes nothing
        auto const g = rank_gradient(n, r, 0);
        auto const p = compress(codec, g, ctx, gc::tensor_id{5});
        codec.decompress_add(std::span<std::byte const>(p), std::span<float>(e), 1.0f, ctx);
      }
      std::vector<std::vector<float>> got(static_cast<std::size_t>(w));
      std::vector<gc::collective_result> res(static_cast<std::size_t>(w));
      REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
        std::vector<float> g = (comm.rank() == w - 1 && w > 1) ? std::vector<float>{} : rank_gradient(n, comm.rank(), 0);
        std::vector<float> out(n, 3.0f);
        auto const rr = all_reduce_compressed(comm, codec, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{5}),
                                              std::span<float>(out), ctx);
        got[static_cast<std::size_t>(comm.rank())] = out;
        res[static_cast<std::size_t>(comm.rank())] = rr;
      }));
      for (int r = 0; r < w; ++r) {
        REQUIRE(got[static_cast<std::size_t>(r)] == e);  // f32 values summed in rank order: exact
        REQUIRE(res[static_cast<std::size_t>(r)].path == gc::collective_path::shared_support);
      }
    }
  }
}

TEST_CASE("shared support: ranks with different seeds are refused on every rank", "[collective][agreement]") {
  shared_stride_codec const codec(5);
  std::vector<int> config_errors(3, 0);
  REQUIRE_THROWS_AS(run_in_process(3, [&](in_process_communicator& comm) {
    gc::codec_context ctx;
    ctx.seed = comm.rank() == 2 ? 8 : 7;
    auto const g = rank_gradient(100, comm.rank(), 0);
    std::vector<float> out(100);
    try {
      all_reduce_compressed(comm, codec, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(out), ctx);
    } catch (gc::config_error const&) {
      config_errors[static_cast<std::size_t>(comm.rank())] = 1;
      throw;
    }
  }), gc::config_error);
  REQUIRE(config_errors == std::vector<int>{1, 1, 1});
}

TEST_CASE("low-rank sessions: the factor all-reduce sequence", "[collective]") {
  std::size_t const rows = 12, cols = 9, n = rows * cols;
  for (int w : {1, 2, 4}) {
    CAPTURE(w);
    // Reference: P = sum_r M_r q (q = ones), p = P/|P|, Q = sum_r M_r^T p, out = p Q^T / w.
    std::vector<float> P(rows, 0.0f), Q(cols, 0.0f);
    for (int r = 0; r < w; ++r) {
      auto const g = rank_gradient(n, r, 0);
      std::vector<float> pr(rows, 0.0f);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) pr[i] += g[i * cols + j];
      for (std::size_t i = 0; i < rows; ++i) P[i] = r == 0 ? pr[i] : P[i] + pr[i];
    }
    rank1_session::normalize(P);
    for (int r = 0; r < w; ++r) {
      auto const g = rank_gradient(n, r, 0);
      std::vector<float> qr(cols, 0.0f);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) qr[j] += g[i * cols + j] * P[i];
      for (std::size_t j = 0; j < cols; ++j) Q[j] = r == 0 ? qr[j] : Q[j] + qr[j];
    }
    std::vector<float> e(n);
    float const alpha = 1.0f / static_cast<float>(w);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) e[i * cols + j] = alpha * (P[i] * Q[j]);
    REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
      rank1_session s(rows);
      auto const g = rank_gradient(n, comm.rank(), 0);
      std::vector<float> out(n);
      gc::collective_options opt;
      opt.op = gc::reduction::average;
      auto const res = all_reduce_compressed(comm, s, gc::tensor_view<float const>(std::span<float const>(g)),
                                             std::span<float>(out), {}, opt);
      RANK_REQUIRE(res.path == gc::collective_path::low_rank);
      RANK_REQUIRE(res.packet_bytes == 4 * (rows + cols));
      RANK_REQUIRE(out == e);
    }));
  }
  // A rank whose session rejects the tensor makes every rank throw; none waits.
  std::vector<int> kinds(3, 0);  // 1 config_error, 2 comm_error
  REQUIRE_THROWS(run_in_process(3, [&](in_process_communicator& comm) {
    rank1_session s(comm.rank() == 1 ? 7 : rows);
    auto const g = rank_gradient(n, comm.rank(), 0);
    std::vector<float> out(n);
    try {
      all_reduce_compressed(comm, s, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(out));
    } catch (gc::config_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 1;
      throw;
    } catch (gc::comm_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 2;
      throw;
    }
  }));
  REQUIRE(kinds == std::vector<int>{2, 1, 2});
}

TEST_CASE("all_reduce_compressed works through any_communicator", "[collective]") {
  gc::any_codec const codec = gc::make_codec("onebit");
  REQUIRE_NOTHROW(run_in_process(3, [&](in_process_communicator& c) {
    gc::any_communicator comm(c);
    auto const g = rank_gradient(500, comm.rank(), 0);
    std::vector<float> a(500), b(500);
    all_reduce_compressed(comm, codec, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(a));
    all_reduce_compressed(c, codec, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(b));
    RANK_REQUIRE(a == b);
  }));
}
