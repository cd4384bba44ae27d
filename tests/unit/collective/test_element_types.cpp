// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The collectives on 16-bit gradients (half, bfloat16): every sum is accumulated in float32 and
// rounded once into the 16-bit output. Each test checks two things on 1-8 in-process ranks:
// agreement with a plain reference (every rank's packet decoded into float32, summed in rank
// order, rounded once), and bit-identity with the float32 collective on the widened gradients,
// rounded once.

#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/parameter_server.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include <catch2/catch.hpp>

#include "collective_support.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

using namespace gradcomp_test;
using gc::in_process_communicator;
using gc::run_in_process;

namespace {

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Equal as numbers (a zero of either sign equals the other: the float32 path decodes its first
// packet in place of 0 + x).
template <class T>
bool same_values(std::vector<T> const& a, std::vector<T> const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(gc::to_float(a[i]) == gc::to_float(b[i]))) return false;
  }
  return true;
}

// Gradients scaled so that 16-bit rounding of partial sums would show: values of very different
// magnitudes, as the heavy-tailed generator gives.
template <class T>
std::vector<T> grad_of(std::size_t n, int rank, int step) {
  return round_vec<T>(rank_gradient(n, rank, step, 77));
}

gc::codec_context ctx_for(int rank, int step, bool same_seed) {
  gc::codec_context c;
  c.seed = same_seed ? 42 : 42 + static_cast<std::uint64_t>(rank);
  c.step = static_cast<std::uint32_t>(step);
  return c;
}

float alpha_of(gc::reduction op, int w) { return op == gc::reduction::average ? 1.0f / static_cast<float>(w) : 1.0f; }

// Runs `all_reduce_compressed` with element type T on `w` ranks for `steps` steps (with or
// without error feedback); returns rank 0's output per step after checking every rank agrees.
template <class T>
std::vector<std::vector<T>> run_compressed(std::string const& spec, int w, std::size_t n, int steps, bool feedback,
                                           gc::reduction op) {
  gc::any_codec const codec = gc::make_codec(spec);
  bool const same = codec.aggregation() != gc::aggregation_kind::gather;
  std::vector<std::vector<std::vector<T>>> outs(static_cast<std::size_t>(w));
  run_in_process(w, [&](in_process_communicator& comm) {
    int const r = comm.rank();
    gc::compressor<gc::any_codec> comp(codec);
    for (int step = 0; step < steps; ++step) {
      std::vector<T> const g = grad_of<T>(n, r, step);
      std::vector<T> out(n, gc::from_float<T>(-1.0f));
      gc::tensor_view<T const> const v(std::span<T const>(g), gc::tensor_id{7});
      gc::collective_options opt;
      opt.op = op;
      gc::collective_result const res =
          feedback ? gc::all_reduce_compressed(comm, comp, v, std::span<T>(out), ctx_for(r, step, same), opt)
                   : gc::all_reduce_compressed(comm, codec, v, std::span<T>(out), ctx_for(r, step, same), opt);
      RANK_REQUIRE(res.packet_bytes > 0);
      outs[static_cast<std::size_t>(r)].push_back(std::move(out));
    }
  });
  for (int r = 1; r < w; ++r) REQUIRE(outs[static_cast<std::size_t>(r)].size() == outs[0].size());
  for (int r = 1; r < w; ++r) {
    for (int s = 0; s < steps; ++s) {
      REQUIRE(same_bits(outs[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)], outs[0][static_cast<std::size_t>(s)]));
    }
  }
  return outs[0];
}

// The plain reference: rank r's packet compressed from its T gradient (through its own
// compressor when `feedback`), decoded, and summed in float32 in rank order, rounded once per
// step. Averaging scales as docs/collectives.md states: gathered packets are added times 1/W
// one by one, summed values (summable, shared support) are scaled after the sum. `per_packet`
// gets the sum accumulated in T (rounded after every packet), which the collectives must not do.
template <class T>
std::vector<std::vector<T>> reference_compressed(std::string const& spec, int w, std::size_t n, int steps, bool feedback,
                                                 gc::reduction op, std::vector<std::vector<T>>* per_packet = nullptr) {
  gc::any_codec const codec = gc::make_codec(spec);
  bool const same = codec.aggregation() != gc::aggregation_kind::gather;
  std::vector<gc::compressor<gc::any_codec>> comps(static_cast<std::size_t>(w), gc::compressor<gc::any_codec>(codec));
  float const alpha = alpha_of(op, w);
  float const each = same ? 1.0f : alpha;  // factor per packet
  std::vector<std::vector<T>> out;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> sum(n, 0.0f);
    std::vector<T> low(n, gc::from_float<T>(0.0f));
    for (int r = 0; r < w; ++r) {
      std::vector<T> const g = grad_of<T>(n, r, step);
      gc::codec_context const ctx = ctx_for(r, step, same);
      std::vector<std::byte> pkt(codec.max_compressed_bytes(n));
      gc::tensor_view<T const> const v(std::span<T const>(g), gc::tensor_id{7});
      std::size_t const bytes = feedback ? comps[static_cast<std::size_t>(r)].compress(v, std::span<std::byte>(pkt), ctx)
                                         : codec.compress(v, std::span<std::byte>(pkt), ctx);
      pkt.resize(bytes);
      std::vector<float> x(n);
      codec.decompress(std::span<std::byte const>(pkt), std::span<float>(x), ctx);
      codec.decompress_add(std::span<std::byte const>(pkt), std::span<float>(sum), each, ctx);
      for (std::size_t i = 0; i < n; ++i) {
        low[i] = gc::from_float<T>(std::fma(alpha, x[i], gc::to_float(low[i])));
      }
    }
    if (same && alpha != 1.0f) {
      for (float& v : sum) v = alpha * v;
    }
    out.push_back(round_vec<T>(sum));
    if (per_packet) per_packet->push_back(std::move(low));
  }
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("all_reduce_compressed on f32/f16/bf16 gradients agrees with the plain reference",
                   "[collective][dtype]", float, gc::half, gc::bfloat16) {
  using T = TestType;
  // gather (int8, top-k, qsgd), summable (identity: the values are summed in float32), shared
  // support (random-k), with and without error feedback, sum and average, 1 to 8 ranks.
  struct config {
    char const* spec;
    bool feedback;
    gc::reduction op;
  };
  config const configs[] = {
      {"int8:bucket=64", false, gc::reduction::sum},       {"topk:ratio=0.3", true, gc::reduction::sum},
      {"qsgd:levels=7,bucket=128", false, gc::reduction::average}, {"identity", false, gc::reduction::sum},
      {"identity", false, gc::reduction::average},         {"randomk:ratio=0.5", true, gc::reduction::sum},
  };
  std::size_t const n = 1000;
  int const steps = 2;
  bool per_packet_differs = false;
  for (config const& c : configs) {
    for (int w : {1, 2, 3, 5, 8}) {
      CAPTURE(c.spec, c.feedback, static_cast<int>(c.op), w);
      std::vector<std::vector<T>> per_packet;
      auto const ref = reference_compressed<T>(c.spec, w, n, steps, c.feedback, c.op, &per_packet);
      auto const got = run_compressed<T>(c.spec, w, n, steps, c.feedback, c.op);
      for (int s = 0; s < steps; ++s) {
        REQUIRE(same_values(got[static_cast<std::size_t>(s)], ref[static_cast<std::size_t>(s)]));
        if (!same_values(got[static_cast<std::size_t>(s)], per_packet[static_cast<std::size_t>(s)])) per_packet_differs = true;
      }
    }
  }
  // The property is not vacuous: accumulating in T, rounding after every packet, gives other
  // results on these gradients.
  if constexpr (!std::is_same_v<T, float>) REQUIRE(per_packet_differs);
}

TEMPLATE_TEST_CASE("all_reduce_compressed on 16-bit gradients equals the float32 collective rounded once",
                   "[collective][dtype]", gc::half, gc::bfloat16) {
  using T = TestType;
  std::size_t const n = 777;
  for (std::string const spec : {"int8:bucket=64", "identity", "fp16", "randomk:ratio=0.2,values=bf16", "onebit"}) {
    for (int w : {1, 4, 7}) {
      CAPTURE(spec, w);
      gc::any_codec const codec = gc::make_codec(spec);
      bool const same = codec.aggregation() != gc::aggregation_kind::gather;
      REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
        int const r = comm.rank();
        gc::compressor<gc::any_codec> c16(codec), c32(codec);
        for (int step = 0; step < 3; ++step) {
          // Rank 1 contributes nothing at step 1.
          bool const silent = r == 1 && step == 1;
          std::vector<T> g = silent ? std::vector<T>{} : grad_of<T>(n, r, step);
          std::vector<float> const gw = widen_vec(g);
          std::vector<T> o16(n);
          std::vector<float> o32(n);
          gc::codec_context const ctx = ctx_for(r, step, same);
          gc::collective_options const opt{gc::reduction::average};
          auto const a = gc::all_reduce_compressed(comm, c16, gc::tensor_view<T const>(std::span<T const>(g), gc::tensor_id{2}),
                                                   std::span<T>(o16), ctx, opt);
          auto const b = gc::all_reduce_compressed(comm, c32, gc::tensor_view<float const>(std::span<float const>(gw), gc::tensor_id{2}),
                                                   std::span<float>(o32), ctx, opt);
          RANK_REQUIRE(a.path == b.path && a.packet_bytes == b.packet_bytes && a.wire_bytes == b.wire_bytes);
          RANK_REQUIRE(same_bits(o16, round_vec<T>(o32)));
        }
        // The residuals of both compressors are the same float32 values.
        auto const& r16 = c16.state(gc::tensor_id{2}).values();
        auto const& r32 = c32.state(gc::tensor_id{2}).values();
        RANK_REQUIRE(r16.size() == r32.size());
        RANK_REQUIRE(r16.empty() || std::memcmp(r16.data(), r32.data(), r16.size_bytes()) == 0);
      }));
    }
  }
}

TEMPLATE_TEST_CASE("all_reduce_compressed on 16-bit gradients may run in place", "[collective][dtype]", gc::half,
                   gc::bfloat16) {
  using T = TestType;
  std::size_t const n = 500;
  for (std::string const spec : {"int8:bucket=64", "identity"}) {
    gc::any_codec const codec = gc::make_codec(spec);
    REQUIRE_NOTHROW(run_in_process(3, [&](in_process_communicator& comm) {
      int const r = comm.rank();
      std::vector<T> const g = grad_of<T>(n, r, 0);
      std::vector<T> out(n), io = g;
      gc::all_reduce_compressed(comm, codec, gc::tensor_view<T const>(std::span<T const>(g)), std::span<T>(out), ctx_for(0, 0, true));
      gc::all_reduce_compressed(comm, codec, gc::tensor_view<T const>(std::span<T const>(io)), std::span<T>(io), ctx_for(0, 0, true));
      RANK_REQUIRE(same_bits(io, out));
    }));
  }
}

TEMPLATE_TEST_CASE("all_reduce_dense on 16-bit gradients", "[collective][dtype]", gc::half, gc::bfloat16) {
  using T = TestType;
  std::size_t const n = 1001;
  for (int w : {1, 2, 5, 8}) {
    for (auto const f : {gc::dense_format::f32, gc::dense_format::f16, gc::dense_format::bf16}) {
      for (auto const op : {gc::reduction::sum, gc::reduction::average}) {
        CAPTURE(w, static_cast<int>(f), static_cast<int>(op));
        // Plain reference for f32: the widened gradients summed in rank order in float32, scaled,
        // rounded once.
        std::vector<float> sum(n, 0.0f);
        for (int r = 0; r < w; ++r) {
          std::vector<float> const g = widen_vec(grad_of<T>(n, r, 0));
          for (std::size_t i = 0; i < n; ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
        }
        if (op == gc::reduction::average) {
          for (float& v : sum) v *= alpha_of(op, w);
        }
        std::vector<T> const ref = round_vec<T>(sum);
        REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
          int const r = comm.rank();
          std::vector<T> const g = grad_of<T>(n, r, 0);
          std::vector<float> const gw = widen_vec(g);
          std::vector<T> o16(n);
          std::vector<float> o32(n);
          gc::collective_options const opt{op};
          auto const a = gc::all_reduce_dense(comm, std::span<T const>(g), std::span<T>(o16), f, opt);
          auto const b = gc::all_reduce_dense(comm, std::span<float const>(gw), std::span<float>(o32), f, opt);
          RANK_REQUIRE(a.path == b.path && a.packet_bytes == b.packet_bytes && a.wire_bytes == b.wire_bytes);
          RANK_REQUIRE(same_bits(o16, round_vec<T>(o32)));
          if (f == gc::dense_format::f32) RANK_REQUIRE(same_values(o16, ref));
          // In place, and a rank without a gradient.
          std::vector<T> io = g;
          gc::all_reduce_dense(comm, std::span<T const>(io), std::span<T>(io), f, opt);
          RANK_REQUIRE(same_bits(io, o16));
        }));
      }
    }
  }
}

TEMPLATE_TEST_CASE("bucketed_all_reduce on 16-bit items", "[collective][bucket][dtype]", gc::half, gc::bfloat16) {
  using T = TestType;
  // Mixed sizes: small ones go dense, large ones compressed; several buckets.
  std::vector<std::size_t> const sizes = {100, 5000, 30, 9000, 4096, 200, 7000};
  for (std::string const spec : {"int8:bucket=64", "identity", "topk:ratio=0.1"}) {
    for (auto const mode : {gc::bucket_compression::per_tensor, gc::bucket_compression::per_bucket}) {
      for (int w : {1, 3, 8}) {
        CAPTURE(spec, static_cast<int>(mode), w);
        gc::bucket_options opt;
        opt.bucket_bytes = 40000;
        opt.mode = mode;
        opt.op = gc::reduction::average;
        gc::any_codec const codec = gc::make_codec(spec);
        bool const same = codec.aggregation() != gc::aggregation_kind::gather;
        REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
          int const r = comm.rank();
          gc::bucketed_all_reduce<gc::compressor<gc::any_codec>> b16(gc::compressor<gc::any_codec>(codec), opt);
          gc::bucketed_all_reduce<gc::compressor<gc::any_codec>> b32(gc::compressor<gc::any_codec>(codec), opt);
          gc::compressor<gc::any_codec> single(codec);
          for (int step = 0; step < 2; ++step) {
            std::vector<std::vector<T>> g, o16, one;
            std::vector<std::vector<float>> gw, o32;
            for (std::size_t t = 0; t < sizes.size(); ++t) {
              g.push_back(grad_of<T>(sizes[t], r * 10 + static_cast<int>(t), step));
              gw.push_back(widen_vec(g.back()));
              o16.emplace_back(sizes[t]);
              o32.emplace_back(sizes[t]);
              one.emplace_back(sizes[t]);
            }
            std::vector<gc::basic_bucket_item<T>> items16;
            std::vector<gc::bucket_item> items32;
            for (std::size_t t = 0; t < sizes.size(); ++t) {
              auto const id = gc::tensor_id{static_cast<std::uint32_t>(t + 1)};
              items16.push_back({gc::tensor_view<T const>(std::span<T const>(g[t]), id), std::span<T>(o16[t])});
              items32.push_back({gc::tensor_view<float const>(std::span<float const>(gw[t]), id), std::span<float>(o32[t])});
            }
            gc::codec_context const ctx = ctx_for(r, step, same);
            auto const a = b16.run(comm, std::span<gc::basic_bucket_item<T> const>(items16), ctx);
            auto const b = b32.run(comm, items32, ctx);
            RANK_REQUIRE(a.buckets == b.buckets && a.dense_buckets == b.dense_buckets && a.packet_bytes == b.packet_bytes);
            for (std::size_t t = 0; t < sizes.size(); ++t) RANK_REQUIRE(same_bits(o16[t], round_vec<T>(o32[t])));
            // Per tensor: as all_reduce_compressed of each compressed tensor, in T.
            if (mode == gc::bucket_compression::per_tensor) {
              for (std::size_t t = 0; t < sizes.size(); ++t) {
                if (sizes[t] < opt.min_compress_elements) continue;
                auto const id = gc::tensor_id{static_cast<std::uint32_t>(t + 1)};
                gc::all_reduce_compressed(comm, single, gc::tensor_view<T const>(std::span<T const>(g[t]), id),
                                          std::span<T>(one[t]), ctx, gc::collective_options{opt.op});
                RANK_REQUIRE(same_bits(one[t], o16[t]));
              }
            }
          }
        }));
      }
    }
  }
}

TEST_CASE("bucketed_all_reduce on 16-bit items rejects mismatched sizes on every rank", "[collective][bucket][dtype]") {
  REQUIRE_NOTHROW(run_in_process(3, [](in_process_communicator& comm) {
    gc::bucketed_all_reduce<gc::int8_codec> b(gc::int8_codec{});
    std::vector<gc::half> g(5000, gc::half(1.0f)), o(comm.rank() == 1 ? 4999 : 5000);
    std::vector<gc::basic_bucket_item<gc::half>> items = {
        {gc::tensor_view<gc::half const>(std::span<gc::half const>(g)), std::span<gc::half>(o)}};
    bool threw = false;
    try {
      b.run(comm, std::span<gc::basic_bucket_item<gc::half> const>(items));
    } catch (gc::error const&) {
      threw = true;
    }
    RANK_REQUIRE(threw);
  }));
}

TEMPLATE_TEST_CASE("all_reduce_low_rank (PowerSGD) on 16-bit gradients", "[collective][powersgd][dtype]", gc::half,
                   gc::bfloat16) {
  using T = TestType;
  std::size_t const rows = 40, cols = 30, n = rows * cols;
  for (int w : {1, 2, 5}) {
    CAPTURE(w);
    REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
      int const r = comm.rank();
      gc::powersgd_options po;
      po.rank = 2;
      gc::powersgd_session s16(rows, cols, po, gc::tensor_id{4}), s32(rows, cols, po, gc::tensor_id{4});
      for (int step = 0; step < 3; ++step) {
        std::vector<T> const g = grad_of<T>(n, r, step);
        std::vector<float> const gw = widen_vec(g);
        std::vector<T> o16(n);
        std::vector<float> o32(n);
        gc::collective_options const opt{gc::reduction::average};
        auto const a = gc::all_reduce_low_rank(comm, s16, gc::tensor_view<T const>(std::span<T const>(g), gc::tensor_id{4}),
                                               std::span<T>(o16), {}, opt);
        auto const b = gc::all_reduce_low_rank(comm, s32, gc::tensor_view<float const>(std::span<float const>(gw), gc::tensor_id{4}),
                                               std::span<float>(o32), {}, opt);
        RANK_REQUIRE(a.packet_bytes == b.packet_bytes && a.wire_bytes == b.wire_bytes);
        RANK_REQUIRE(same_bits(o16, round_vec<T>(o32)));
      }
      // The residual (float32) is the same in both sessions: error feedback saw the same values.
      auto const e16 = s16.state().residual();
      auto const e32 = s32.state().residual();
      RANK_REQUIRE(e16.size() == e32.size());
      RANK_REQUIRE(e16 == e32);
    }));
  }
}

TEMPLATE_TEST_CASE("two-way and parameter-server collectives on 16-bit gradients", "[collective][two_way][dtype]",
                   gc::half, gc::bfloat16) {
  using T = TestType;
  std::size_t const n = 1003;
  using tw_t = gc::two_way_compressor<gc::any_codec>;
  for (std::string const spec : {"int8:bucket=64", "topk:ratio=0.2"}) {
    for (int w : {1, 2, 4, 8}) {
      CAPTURE(spec, w);
      gc::any_codec const codec = gc::make_codec(spec);
      REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
        int const r = comm.rank();
        tw_t t16(codec), t32(codec);
        for (int step = 0; step < 3; ++step) {
          std::vector<T> const g = grad_of<T>(n, r, step);
          std::vector<float> const gw = widen_vec(g);
          std::vector<T> o16(n);
          std::vector<float> o32(n);
          gc::codec_context const ctx = ctx_for(r, step, false);
          gc::collective_options const opt{gc::reduction::average};
          auto const a = gc::all_reduce_two_way(comm, t16, gc::tensor_view<T const>(std::span<T const>(g), gc::tensor_id{6}),
                                                std::span<T>(o16), ctx, opt);
          auto const b = gc::all_reduce_two_way(comm, t32, gc::tensor_view<float const>(std::span<float const>(gw), gc::tensor_id{6}),
                                                std::span<float>(o32), ctx, opt);
          RANK_REQUIRE(a.packet_bytes == b.packet_bytes && a.wire_bytes == b.wire_bytes);
          RANK_REQUIRE(same_bits(o16, round_vec<T>(o32)));
          // Each element is decoded from one server packet: the 16-bit result is that packet's
          // value rounded once, so it lies within half an ulp of the float32 result.
          for (std::size_t i = 0; i < n; ++i) {
            float const x = o32[i], y = gc::to_float(o16[i]);
            RANK_REQUIRE(gc::to_float(gc::from_float<T>(x)) == y);
          }
        }
      }));
      if (w < 2) continue;
      // Parameter server: the last rank serves; workers pass T.
      REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
        int const r = comm.rank();
        tw_t t16(codec), t32(codec);
        gc::ps_options popt;
        popt.op = gc::reduction::average;
        for (int step = 0; step < 2; ++step) {
          gc::codec_context const ctx = ctx_for(r, step, false);
          if (gc::is_server(comm, popt)) {
            gc::ps_serve(comm, t16, gc::tensor_id{8}, n, ctx, popt);
            gc::ps_serve(comm, t32, gc::tensor_id{8}, n, ctx, popt);
            continue;
          }
          std::vector<T> const g = grad_of<T>(n, r, step);
          std::vector<float> const gw = widen_vec(g);
          std::vector<T> o16(n);
          std::vector<float> o32(n);
          gc::ps_push_pull(comm, t16, gc::tensor_view<T const>(std::span<T const>(g), gc::tensor_id{8}), std::span<T>(o16), ctx, popt);
          gc::ps_push_pull(comm, t32, gc::tensor_view<float const>(std::span<float const>(gw), gc::tensor_id{8}), std::span<float>(o32), ctx,
                           popt);
          RANK_REQUIRE(same_bits(o16, round_vec<T>(o32)));
        }
      }));
    }
  }
}
