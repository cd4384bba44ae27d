// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0

#include <gradcomp/collective/parameter_server.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>

#include <catch2/catch.hpp>

#include "collective_support.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace gradcomp_test;
using gc::in_process_communicator;
using gc::run_in_process;

namespace {

using two_way = gc::two_way_compressor<gc::any_codec>;

// Reference of one two-way step, simulated rank by rank with the same objects.
std::vector<float> two_way_reference(std::vector<two_way>& tws, std::vector<std::vector<float>> const& grads,
                                     std::size_t n, gc::tensor_id id, float scale, gc::codec_context const& ctx) {
  std::size_t const w = tws.size();
  std::vector<float> out(n);
  for (std::size_t s = 0; s < w; ++s) {
    auto const [b, e] = gc::shard_range(n, s, w);
    std::vector<std::vector<std::byte>> pk(w);
    std::vector<std::span<std::byte const>> spans;
    for (std::size_t r = 0; r < w; ++r) {
      pk[r].resize(tws[r].worker_codec().max_compressed_bytes(e - b));
      if (!grads[r].empty()) {
        pk[r].resize(tws[r].compress_shard(std::span<float const>(grads[r]).subspan(b, e - b),
                                           gc::shard_key{id, static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(w)},
                                           std::span<std::byte>(pk[r]), ctx));
      } else {
        pk[r].clear();
      }
      spans.emplace_back(pk[r]);
    }
    std::vector<std::byte> sp(tws[s].server_codec().max_compressed_bytes(e - b));
    sp.resize(tws[s].reduce_shard(spans, e - b, gc::shard_key{id, static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(w)},
                                  scale, std::span<std::byte>(sp), ctx));
    tws[s].server_codec().decompress(std::span<std::byte const>(sp), std::span<float>(out).subspan(b, e - b), ctx);
  }
  return out;
}

}  // namespace

TEST_CASE("two-way all-reduce equals the shard-by-shard reference for every codec family", "[collective][two_way]") {
  for (std::string spec : {"identity", "fp16", "onebit", "topk:ratio=0.05", "qsgd:levels=3,bucket=64", "int8:bucket=32"}) {
    for (int w : {1, 2, 3, 5}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{1001}}) {
        CAPTURE(spec, w, n);
        gc::any_codec const codec = gc::make_codec(spec);
        int const silent = w >= 3 ? 1 : -1;
        gc::codec_context ctx;
        ctx.seed = 5;
        std::vector<two_way> ref_tws(static_cast<std::size_t>(w), two_way(codec));
        std::vector<std::vector<std::vector<float>>> expected;
        for (int step = 0; step < 3; ++step) {
          ctx.step = static_cast<std::uint32_t>(step);
          std::vector<std::vector<float>> grads;
          for (int r = 0; r < w; ++r) grads.push_back(r == silent ? std::vector<float>{} : rank_gradient(n, r, step));
          expected.push_back({two_way_reference(ref_tws, grads, n, gc::tensor_id{2}, 1.0f / static_cast<float>(w), ctx)});
        }
        REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
          two_way tw(codec);
          gc::codec_context c;
          c.seed = 5;
          for (int step = 0; step < 3; ++step) {
            c.step = static_cast<std::uint32_t>(step);
            auto const g = comm.rank() == silent ? std::vector<float>{} : rank_gradient(n, comm.rank(), step);
            std::vector<float> out(n, 7.0f);
            gc::collective_options opt;
            opt.op = gc::reduction::average;
            auto const res = gc::all_reduce_two_way(comm, tw, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{2}),
                                                    std::span<float>(out), c, opt);
            RANK_REQUIRE(res.path == gc::collective_path::two_way);
            RANK_REQUIRE(out == expected[static_cast<std::size_t>(step)][0]);
          }
        }));
      }
    }
  }
}

TEST_CASE("two-way: lossless codecs give the plain average", "[collective][two_way]") {
  REQUIRE_NOTHROW(run_in_process(4, [](in_process_communicator& comm) {
    gc::two_way_compressor<gc::identity_codec> tw;
    std::vector<float> g(10, static_cast<float>(comm.rank() + 1));
    std::vector<float> out(10);
    gc::collective_options opt;
    opt.op = gc::reduction::average;
    gc::all_reduce_two_way(comm, tw, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(out), {}, opt);
    RANK_REQUIRE(out == std::vector<float>(10, 2.5f));
  }));
}

TEST_CASE("server error feedback conserves mass: sent + residual = received", "[collective][two_way]") {
  // Drive the server side directly with worker packets and check, per step and cumulatively,
  // sum of decoded server packets + server residual = sum of what the server received.
  for (std::string spec : {"topk:ratio=0.02", "onebit", "qsgd:levels=1,bucket=32"}) {
    CAPTURE(spec);
    two_way tw(gc::make_codec(spec));
    std::size_t const n = 3001;
    gc::shard_key const key{gc::tensor_id{9}, 1, 4};
    std::vector<double> sent(n, 0.0), received(n, 0.0);
    for (int step = 0; step < 20; ++step) {
      gc::codec_context ctx;
      ctx.step = static_cast<std::uint32_t>(step);
      std::vector<std::vector<std::byte>> pk;
      for (int r = 0; r < 3; ++r) {
        auto const g = rank_gradient(n, r, step);
        std::vector<std::byte> p(tw.worker_codec().max_compressed_bytes(n));
        p.resize(tw.compress_shard(g, gc::shard_key{gc::tensor_id{9}, 1, 4}, std::span<std::byte>(p), ctx));
        pk.push_back(std::move(p));
      }
      std::vector<std::span<std::byte const>> spans(pk.begin(), pk.end());
      std::vector<std::byte> out(tw.server_codec().max_compressed_bytes(n));
      std::vector<float> in;
      out.resize(tw.reduce_shard(spans, n, key, 1.0f, std::span<std::byte>(out), ctx, &in));
      std::vector<float> dec(n);
      tw.server_codec().decompress(std::span<std::byte const>(out), std::span<float>(dec), ctx);
      double scale = 0;
      for (std::size_t i = 0; i < n; ++i) {
        sent[i] += dec[i];
        received[i] += in[i];
        scale = std::max(scale, std::fabs(received[i]) + std::fabs(sent[i]));
      }
      auto const res = tw.server_residual(key);
      REQUIRE(res.size() == n);
      for (std::size_t i = 0; i < n; ++i) {
        // float residual updates: a few ulps of the running magnitude per step
        REQUIRE(std::fabs(sent[i] + res[i] - received[i]) <= 1e-5 * (scale + 1e-6) * (step + 1));
      }
    }
  }
}

TEST_CASE("two-way over the all-reduce conserves mass on both sides", "[collective][two_way]") {
  // sum_t out_t + sum_s server residual_s + sum_w worker residuals = sum_t sum_w g_w,t
  int const w = 4;
  std::size_t const n = 2000;
  int const steps = 10;
  std::vector<std::vector<float>> residual_sum(w, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> out_sum(w, std::vector<float>(n, 0.0f));
  REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
    two_way tw(gc::make_codec("topk:ratio=0.03"));
    auto& rs = residual_sum[static_cast<std::size_t>(comm.rank())];
    auto& os = out_sum[static_cast<std::size_t>(comm.rank())];
    for (int step = 0; step < steps; ++step) {
      auto const g = rank_gradient(n, comm.rank(), step);
      std::vector<float> out(n);
      gc::all_reduce_two_way(comm, tw, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{1}), std::span<float>(out));
      for (std::size_t i = 0; i < n; ++i) os[i] += out[i];
    }
    for (std::size_t s = 0; s < static_cast<std::size_t>(w); ++s) {
      auto const [b, e] = gc::shard_range(n, s, w);
      auto const wr = tw.worker_residual(gc::shard_key{gc::tensor_id{1}, static_cast<std::uint32_t>(s), w});
      for (std::size_t i = b; i < e; ++i) rs[i] += wr[i - b];
      if (s == static_cast<std::size_t>(comm.rank())) {
        auto const sr = tw.server_residual(gc::shard_key{gc::tensor_id{1}, static_cast<std::uint32_t>(s), w});
        for (std::size_t i = b; i < e; ++i) rs[i] += sr[i - b];
      }
    }
  }));
  std::vector<double> total(n, 0.0), mag(n, 0.0);
  for (int step = 0; step < steps; ++step)
    for (int r = 0; r < w; ++r) {
      auto const g = rank_gradient(n, r, step);
      for (std::size_t i = 0; i < n; ++i) {
        total[i] += g[i];
        mag[i] += std::fabs(g[i]);
      }
    }
  for (std::size_t i = 0; i < n; ++i) {
    double got = out_sum[0][i];
    for (int r = 0; r < w; ++r) got += residual_sum[static_cast<std::size_t>(r)][i];
    REQUIRE(std::fabs(got - total[i]) <= 1e-4 * mag[i] + 1e-9);
  }
}

TEST_CASE("parameter-server mode: workers push, servers sum and push back", "[collective][two_way]") {
  for (std::string spec : {"identity", "onebit", "topk:ratio=0.1"}) {
    for (int servers : {1, 2}) {
      int const size = 5;
      int const workers = size - servers;
      int const silent = 0;  // worker 0 sits out step 1
      std::size_t const n = 999;
      CAPTURE(spec, servers);
      gc::any_codec const codec = gc::make_codec(spec);
      // Reference: per server shard, the two-way reduction of the workers' packets.
      std::vector<two_way> wref(static_cast<std::size_t>(workers), two_way(codec));
      std::vector<two_way> sref(static_cast<std::size_t>(servers), two_way(codec));
      std::vector<std::vector<float>> expected;
      for (int step = 0; step < 3; ++step) {
        gc::codec_context ctx;
        ctx.step = static_cast<std::uint32_t>(step);
        std::vector<float> e(n);
        for (int s = 0; s < servers; ++s) {
          auto const [b, en] = gc::shard_range(n, static_cast<std::size_t>(s), static_cast<std::size_t>(servers));
          gc::shard_key const key{gc::tensor_id{4}, static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(servers)};
          std::vector<std::vector<std::byte>> pk;
          for (int w = 0; w < workers; ++w) {
            if (w == silent && step == 1) {
              pk.emplace_back();  // contributes nothing this step
              continue;
            }
            auto const g = rank_gradient(n, w, step);
            std::vector<std::byte> p(codec.max_compressed_bytes(en - b));
            p.resize(wref[static_cast<std::size_t>(w)].compress_shard(std::span<float const>(g).subspan(b, en - b), key, std::span<std::byte>(p), ctx));
            pk.push_back(std::move(p));
          }
          std::vector<std::span<std::byte const>> spans(pk.begin(), pk.end());
          std::vector<std::byte> sp(codec.max_compressed_bytes(en - b));
          sp.resize(sref[static_cast<std::size_t>(s)].reduce_shard(spans, en - b, key, 1.0f, std::span<std::byte>(sp), ctx));
          codec.decompress(std::span<std::byte const>(sp), std::span<float>(e).subspan(b, en - b), ctx);
        }
        expected.push_back(std::move(e));
      }
      gc::ps_options opt;
      opt.servers = servers;
      REQUIRE_NOTHROW(run_in_process(size, [&](in_process_communicator& comm) {
        two_way tw(codec);
        for (int step = 0; step < 3; ++step) {
          gc::codec_context ctx;
          ctx.step = static_cast<std::uint32_t>(step);
          if (gc::is_server(comm, opt)) {
            gc::ps_serve(comm, tw, gc::tensor_id{4}, n, ctx, opt);
          } else {
            auto const g = comm.rank() == silent && step == 1 ? std::vector<float>{} : rank_gradient(n, comm.rank(), step);
            std::vector<float> out(n);
            auto const res = gc::ps_push_pull(comm, tw, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{4}),
                                              std::span<float>(out), ctx, opt);
            RANK_REQUIRE(res.path == gc::collective_path::parameter_server);
            RANK_REQUIRE(out == expected[static_cast<std::size_t>(step)]);
          }
        }
      }));
    }
  }
}

TEST_CASE("parameter-server mode: a worker with another codec makes every rank throw", "[collective][two_way][agreement]") {
  // Ranks record what they caught and return normally: a rank that threw out of
  // run_in_process would break the world for the ranks still reading their replies.
  std::vector<int> kinds(4, 0);
  gc::ps_options opt;
  opt.servers = 1;
  REQUIRE_NOTHROW(run_in_process(4, [&](in_process_communicator& comm) {
    two_way tw(gc::make_codec(comm.rank() == 1 ? "onebit" : "topk:ratio=0.1"));
    try {
      if (gc::is_server(comm, opt)) {
        gc::ps_serve(comm, tw, gc::tensor_id{0}, 300, {}, opt);
      } else {
        auto const g = rank_gradient(300, comm.rank(), 0);
        std::vector<float> out(300);
        gc::ps_push_pull(comm, tw, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(out), {}, opt);
      }
    } catch (gc::config_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 1;
    }
  }));
  REQUIRE(kinds == std::vector<int>{1, 1, 1, 1});
}

TEST_CASE("parameter-server mode: a failed worker compression reaches every rank", "[collective][two_way][agreement]") {
  std::vector<int> kinds(4, 0);  // 1 numeric_error, 2 comm_error
  gc::ps_options opt;
  opt.servers = 2;
  REQUIRE_NOTHROW(run_in_process(4, [&](in_process_communicator& comm) {
    two_way tw(gc::make_codec("onebit"));
    try {
      if (gc::is_server(comm, opt)) {
        gc::ps_serve(comm, tw, gc::tensor_id{0}, 300, {}, opt);
      } else {
        auto g = rank_gradient(300, comm.rank(), 0);
        if (comm.rank() == 0) g[200] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> out(300);
        gc::ps_push_pull(comm, tw, gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(out), {}, opt);
      }
    } catch (gc::numeric_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 1;
    } catch (gc::comm_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 2;
    }
  }));
  REQUIRE(kinds == std::vector<int>{1, 2, 2, 2});
}

TEST_CASE("two-way: for_each_state visits one side's states of one tensor", "[collective][two_way]") {
  two_way tw(gc::make_codec("topk:ratio=0.05"));
  std::size_t const n = 400;
  gc::codec_context ctx;
  auto const g = rank_gradient(n, 0, 0);
  std::vector<std::byte> p(tw.worker_codec().max_compressed_bytes(n));
  for (gc::shard_key const key : {gc::shard_key{gc::tensor_id{3}, 0, 2}, gc::shard_key{gc::tensor_id{3}, 1, 2},
                                  gc::shard_key{gc::tensor_id{4}, 0, 2}, gc::shard_key{gc::tensor_id{2}, 1, 2}}) {
    tw.compress_shard(g, key, std::span<std::byte>(p), ctx);
  }
  std::vector<gc::shard_key> seen;
  tw.for_each_state(gc::two_way_side::worker, gc::tensor_id{3}, [&](gc::shard_key const& k, auto& st) {
    REQUIRE(st.values().size() == n);
    seen.push_back(k);
  });
  REQUIRE(seen == std::vector<gc::shard_key>{{gc::tensor_id{3}, 0, 2}, {gc::tensor_id{3}, 1, 2}});
  seen.clear();
  tw.for_each_state(gc::two_way_side::server, gc::tensor_id{3}, [&](gc::shard_key const& k, auto&) { seen.push_back(k); });
  REQUIRE(seen.empty());  // no server step yet
}

TEST_CASE("two-way random-k: the server keeps the workers' support, so k coordinates survive per shard",
          "[collective][two_way][regression]") {
  // Regression: the server re-sampled random-k on its own stream, so only about k^2/n of a
  // shard's k coordinates survived (4 ranks, ratio 0.1, 4000 elements: ~50 non-zero outputs
  // where top-k gives 400). Server and workers share the support now, so with f32 values the
  // server sum is lossless and the result is exactly the average on the workers' support.
  int const w = 4;
  std::size_t const n = 4000;
  {
    gc::any_codec const codec = gc::make_codec("randomk:ratio=0.1");
    REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
      two_way tw(codec);
      gc::codec_context ctx;
      ctx.seed = 11;
      for (int step = 0; step < 2; ++step) {
        ctx.step = static_cast<std::uint32_t>(step);
        auto const g = rank_gradient(n, comm.rank(), step);
        std::vector<float> out(n);
        gc::collective_options opt;
        opt.op = gc::reduction::sum;
        gc::all_reduce_two_way(comm, tw, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{1}),
                               std::span<float>(out), ctx, opt);
        auto const nonzero = std::count_if(out.begin(), out.end(), [](float v) { return v != 0.0f; });
        RANK_REQUIRE(nonzero == 400);
        // Lossless server: nothing is left in the server residual of this rank's shard.
        gc::shard_key const key{gc::tensor_id{1}, static_cast<std::uint32_t>(comm.rank()), static_cast<std::uint32_t>(w)};
        auto const r = tw.server_residual(key);
        RANK_REQUIRE(std::all_of(r.begin(), r.end(), [](float v) { return v == 0.0f; }));
      }
    }));
  }
}

TEST_CASE("parameter-server random-k: servers keep the workers' support", "[collective][two_way][regression]") {
  int const size = 5, servers = 2;
  std::size_t const n = 4000;
  gc::any_codec const codec = gc::make_codec("randomk:ratio=0.1");
  gc::ps_options opt;
  opt.servers = servers;
  REQUIRE_NOTHROW(run_in_process(size, [&](in_process_communicator& comm) {
    two_way tw(codec);
    gc::codec_context ctx;
    ctx.seed = 3;
    if (gc::is_server(comm, opt)) {
      gc::ps_serve(comm, tw, gc::tensor_id{2}, n, ctx, opt);
      return;
    }
    auto const g = rank_gradient(n, comm.rank(), 0);
    std::vector<float> out(n);
    gc::ps_push_pull(comm, tw, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{2}),
                     std::span<float>(out), ctx, opt);
    // Each of the 2 shards of 2000 keeps 200 coordinates, the same on every worker.
    auto const nonzero = std::count_if(out.begin(), out.end(), [](float v) { return v != 0.0f; });
    RANK_REQUIRE(nonzero == 400);
  }));
}
