// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0

#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/feedback/compressor.hpp>

#include <catch2/catch.hpp>

#include "collective_support.hpp"

#include <string>
#include <vector>

using namespace gradcomp_test;
using gc::in_process_communicator;
using gc::run_in_process;

namespace {

std::vector<std::size_t> const layer_sizes = {10, 5000, 3, 7000, 1, 4096, 100, 12000, 0, 4500};

}  // namespace

TEST_CASE("bucketing per tensor is bit-identical to per-tensor all-reduces", "[collective][bucket]") {
  for (std::string spec : {"fp16", "onebit", "topk:ratio=0.02", "qsgd:levels=7,bucket=128", "threshold:value=0.002"}) {
    for (bool pipeline : {true, false}) {
      for (auto small : {gc::dense_format::f32, gc::dense_format::bf16}) {
        for (int w : {1, 4}) {
          CAPTURE(spec, pipeline, gc::dense_format_name(small), w);
          gc::bucket_options opt;
          opt.bucket_bytes = 40000;  // a few tensors per bucket
          opt.min_compress_elements = 1000;
          opt.small_format = small;
          opt.pipeline = pipeline;
          opt.op = gc::reduction::average;
          REQUIRE_NOTHROW(run_in_process(w, [&](in_process_communicator& comm) {
            gc::any_codec const codec = gc::make_codec(spec);
            gc::bucketed_all_reduce<gc::compressor<gc::any_codec>> bucketed(gc::compressor<gc::any_codec>(codec), opt);
            gc::compressor<gc::any_codec> single(codec);
            for (int step = 0; step < 2; ++step) {
              gc::codec_context ctx;
              ctx.seed = 11 + static_cast<std::uint64_t>(comm.rank());
              ctx.step = static_cast<std::uint32_t>(step);
              std::vector<std::vector<float>> g, a, b;
              for (std::size_t t = 0; t < layer_sizes.size(); ++t) {
                g.push_back(rank_gradient(layer_sizes[t], comm.rank(), step, t));
                a.emplace_back(layer_sizes[t], -1.0f);
                b.emplace_back(layer_sizes[t], -2.0f);
              }
              std::vector<gc::bucket_item> items;
              for (std::size_t t = 0; t < g.size(); ++t) {
                items.push_back({gc::tensor_view<float const>(std::span<float const>(g[t]), gc::tensor_id{static_cast<std::uint32_t>(t)}),
                                 std::span<float>(a[t])});
              }
              auto const res = bucketed.run(comm, items, ctx);
              RANK_REQUIRE(res.buckets >= 3);
              gc::collective_options copt;
              copt.op = opt.op;
              for (std::size_t t = 0; t < g.size(); ++t) {
                gc::tensor_view<float const> v{std::span<float const>(g[t]), gc::tensor_id{static_cast<std::uint32_t>(t)}};
                if (layer_sizes[t] < opt.min_compress_elements) {
                  gc::all_reduce_dense(comm, std::span<float const>(g[t]), std::span<float>(b[t]), small, copt, ctx);
                } else {
                  gc::all_reduce_compressed(comm, single, v, std::span<float>(b[t]), ctx, copt);
                }
                RANK_REQUIRE(a[t] == b[t]);
              }
            }
          }));
        }
      }
    }
  }
}

TEST_CASE("bucketing per bucket equals compressing the fused bucket", "[collective][bucket]") {
  for (std::string spec : {"topk:ratio=0.02", "onebit", "identity"}) {
    CAPTURE(spec);
    gc::bucket_options opt;
    opt.bucket_bytes = 1 << 30;  // one compressed bucket, one dense bucket
    opt.min_compress_elements = 1000;
    opt.mode = gc::bucket_compression::per_bucket;
    REQUIRE_NOTHROW(run_in_process(3, [&](in_process_communicator& comm) {
      gc::any_codec const codec = gc::make_codec(spec);
      gc::bucketed_all_reduce<gc::compressor<gc::any_codec>> bucketed(gc::compressor<gc::any_codec>(codec), opt);
      gc::compressor<gc::any_codec> fused_comp(codec);
      for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> g, a;
        std::vector<float> fused_g, small_g;
        for (std::size_t t = 0; t < layer_sizes.size(); ++t) {
          g.push_back(rank_gradient(layer_sizes[t], comm.rank(), step, t));
          a.emplace_back(layer_sizes[t], -1.0f);
          auto& dst = layer_sizes[t] < opt.min_compress_elements ? small_g : fused_g;
          dst.insert(dst.end(), g.back().begin(), g.back().end());
        }
        std::vector<gc::bucket_item> items;
        for (std::size_t t = 0; t < g.size(); ++t) {
          items.push_back({gc::tensor_view<float const>(std::span<float const>(g[t]), gc::tensor_id{static_cast<std::uint32_t>(100 + t)}),
                           std::span<float>(a[t])});
        }
        auto const res = bucketed.run(comm, items);
        RANK_REQUIRE(res.buckets == 2);
        RANK_REQUIRE(res.dense_buckets == 1);
        // First compressed tensor is layer 1 (id 101): the fused bucket's id.
        std::vector<float> fused_out(fused_g.size()), small_out(small_g.size());
        gc::all_reduce_compressed(comm, fused_comp, gc::tensor_view<float const>(std::span<float const>(fused_g), gc::tensor_id{101}),
                                  std::span<float>(fused_out));
        gc::all_reduce_dense(comm, std::span<float const>(small_g), std::span<float>(small_out));
        std::size_t fa = 0, sa = 0;
        for (std::size_t t = 0; t < g.size(); ++t) {
          bool const small = layer_sizes[t] < opt.min_compress_elements;
          auto const& src = small ? small_out : fused_out;
          std::size_t& at = small ? sa : fa;
          RANK_REQUIRE(std::equal(a[t].begin(), a[t].end(), src.begin() + static_cast<std::ptrdiff_t>(at)));
          at += layer_sizes[t];
        }
      }
    }));
  }
}

TEST_CASE("bucketing: a rank with a different layout is refused on every rank", "[collective][bucket][agreement]") {
  std::vector<int> kinds(3, 0);
  REQUIRE_THROWS(run_in_process(3, [&](in_process_communicator& comm) {
    gc::bucketed_all_reduce<gc::any_codec> bucketed(gc::make_codec("onebit"));
    std::vector<float> g1(5000, 1.0f), g2(comm.rank() == 2 ? 4000 : 5000, 1.0f), o1(5000), o2(g2.size());
    std::vector<gc::bucket_item> items{{gc::tensor_view<float const>(std::span<float const>(g1)), std::span<float>(o1)},
                                       {gc::tensor_view<float const>(std::span<float const>(g2)), std::span<float>(o2)}};
    try {
      bucketed.run(comm, items);
    } catch (gc::config_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 1;
      throw;
    }
  }));
  REQUIRE(kinds == std::vector<int>{1, 1, 1});
}

TEST_CASE("bucketing: a rank with a malformed item stops every rank at the layout round", "[collective][bucket][agreement]") {
  std::vector<int> kinds(3, 0);  // 1 config_error, 2 comm_error
  REQUIRE_THROWS(run_in_process(3, [&](in_process_communicator& comm) {
    gc::bucketed_all_reduce<gc::any_codec> bucketed(gc::make_codec("topk:ratio=0.1"));
    std::vector<float> g(5000, 1.0f), o(comm.rank() == 0 ? 4999 : 5000);
    std::vector<gc::bucket_item> items{{gc::tensor_view<float const>(std::span<float const>(g)), std::span<float>(o)}};
    try {
      bucketed.run(comm, items);
    } catch (gc::config_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 1;
      throw;
    } catch (gc::comm_error const&) {
      kinds[static_cast<std::size_t>(comm.rank())] = 2;
      throw;
    }
  }));
  REQUIRE(kinds == std::vector<int>{1, 2, 2});
}
