// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The hierarchical all-reduce (collective/hierarchical.hpp) with device codecs over the node and
// lane communicators a transport splits off (`hierarchical_groups`), checked on a machine
// without a GPU against the CPU hierarchical all-reduce.
//
// Real: the hierarchical collective's code with its device memory space (intra-node formats
// through `device_memory::narrow` / `widen` / `add`), the device codecs and device error
// feedback, and the CPU collective they are compared with. Host emulation (what needs a GPU):
// this file is built with Thrust's CPP device system, so device memory is host memory that
// cuda/memory.cuh records as device allocations; every communicator — the parent and the node
// and lane communicators, each an in-process world of its own as `nccl_communicator::split`
// would make them — is an `emulated_nccl` (emulated_nccl.cuh) that records which operations
// carried device payloads and which host control messages.

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "../unit/support/split_worlds.hpp"
#include "device_buffers.cuh"
#include "emulated_nccl.cuh"

#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/comm/group.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/cuda/collective.cuh>
#include <gradcomp/cuda/memory.cuh>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#if GRADCOMP_CUDA_ON_GPU
#  error "hierarchical_host.cu is the host emulation: build it with THRUST_DEVICE_SYSTEM_CPP"
#endif

using gct::emulated_nccl;
using gct::floats;
using gct::same_bits;
using gct::thrown;
using gct::to_device;
using gct::to_host;
using gct::traffic;
using gradcomp_test::split_worlds;

namespace {

using shape = gradcomp_test::grouping_case;

std::vector<shape> shapes() {
  return {{"4 ranks as 2 nodes of 2", 4, gc::node_grouping::uniform(2)},
          {"uneven: {0,3} {1,2,4}", 5, gc::node_grouping::explicit_nodes({{0, 3}, {1, 2, 4}})},
          {"6 ranks as 2 nodes of 3", 6, gc::node_grouping::uniform(3)},
          {"1 node of 3", 3, gc::node_grouping::uniform(3)},
          {"3 nodes of 1", 3, gc::node_grouping::uniform(1)}};
}

std::vector<float> gradient(std::size_t n, int r, std::uint32_t step) {
  return gct::gradient_of(n, 0x41e7u + 7919u * static_cast<unsigned>(r) + 31u * step + n);
}

template <class Source>
gc::codec_context context_for(Source const& src, int r, std::uint32_t step) {
  return gct::rank_context_of(r, step, 0x41e70000u, gct::shared_support(src));
}

constexpr gc::tensor_id id{12};

// One rank after a step: the output, the owner's residual (empty without feedback or on a rank
// that owns no shard) and what the collective reported.
struct rank_state {
  std::vector<float> out;
  std::vector<float> residual;
  gc::hierarchical_result res;
};

template <class Source>
std::vector<float> residual_of(Source& src, gc::tensor_id shard) {
  if constexpr (requires { { src.state(shard) } -> std::convertible_to<std::span<float const>>; }) {
    return to_host(src.state(shard));  // cuda::device_compressor: device memory
  } else if constexpr (requires { src.state(shard).values(); }) {
    auto const e = src.state(shard).values();  // compressor<C, residual_feedback>
    return {e.begin(), e.end()};
  } else {
    return {};
  }
}

void expect_same(std::vector<rank_state> const& want, std::vector<rank_state> const& got) {
  REQUIRE(want.size() == got.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    INFO("rank " << r);
    CHECK(same_bits(want[r].out, got[r].out));
    CHECK(same_bits(want[r].residual, got[r].residual));
    CHECK(want[r].res.inter_path == got[r].res.inter_path);
    CHECK(want[r].res.nodes == got[r].res.nodes);
    CHECK(want[r].res.lanes == got[r].res.lanes);
    CHECK(want[r].res.packet_bytes == got[r].res.packet_bytes);
    CHECK(want[r].res.wire_bytes == got[r].res.wire_bytes);
    CHECK(want[r].res.inter_node_bytes == got[r].res.inter_node_bytes);
  }
}

// `steps` steps of the CPU hierarchical all-reduce (its point-to-point groups) with a source
// from `make_cpu()` and of the device one over split communicators with one from `make_dev()`,
// each rank's source kept across the steps; the ranks in `silent` pass empty gradients.
// Returns the last step's states of both runs.
template <class MakeCpu, class MakeDev>
std::pair<std::vector<rank_state>, std::vector<rank_state>> run_both(
    MakeCpu&& make_cpu, MakeDev&& make_dev, shape const& s, std::size_t n,
    gc::hierarchical_options const& opt, int steps, traffic& log, std::vector<int> const& silent = {}) {
  auto const w = static_cast<std::size_t>(s.ranks);
  std::vector<rank_state> want(w), got(w);
  gc::node_layout const layout = s.nodes.layout(s.ranks);
  int const lanes = opt.lanes == 0 ? layout.min_node_size() : opt.lanes;
  auto shard_of = [&](int r) -> std::optional<gc::tensor_id> {
    int const j = layout.local_rank(r);
    if (j >= lanes || layout.nodes() == 1) return std::nullopt;
    return gc::hierarchical_shard_id(id, j, lanes);
  };
  auto is_silent = [&](int r) { return std::find(silent.begin(), silent.end(), r) != silent.end(); };
  REQUIRE_NOTHROW(gc::run_in_process(s.ranks, [&](gc::in_process_communicator& comm) {
    int const r = comm.rank();
    auto src = make_cpu();
    rank_state st;
    st.out.assign(n, -3.0f);
    for (int t = 0; t < steps; ++t) {
      auto const step = static_cast<std::uint32_t>(t);
      std::vector<float> const g = is_silent(r) ? std::vector<float>{} : gradient(n, r, step);
      st.res = gc::all_reduce_hierarchical(
          comm, src, gc::tensor_view<float const>(std::span<float const>(g), id),
          std::span<float>(st.out), context_for(src, r, step), opt);
    }
    if (auto const shard = shard_of(r)) st.residual = residual_of(src, *shard);
    want[static_cast<std::size_t>(r)] = std::move(st);
  }));
  split_worlds const sub(s.nodes, s.ranks, opt.lanes);
  REQUIRE_NOTHROW(gc::run_in_process(s.ranks, [&](gc::in_process_communicator& inner) {
    emulated_nccl comm(inner, log);
    int const r = comm.rank();
    emulated_nccl node(sub.node(r), log);
    std::optional<emulated_nccl> lane;
    if (auto l = sub.lane(r)) lane.emplace(*l, log);
    gc::hierarchical_groups<emulated_nccl> const groups{&node, lane ? &*lane : nullptr};
    auto src = make_dev();
    gc::cuda::device_buffer out = to_device(std::vector<float>(n, -3.0f));
    rank_state st;
    for (int t = 0; t < steps; ++t) {
      auto const step = static_cast<std::uint32_t>(t);
      std::vector<float> const hg = is_silent(r) ? std::vector<float>{} : gradient(n, r, step);
      gc::cuda::device_buffer g = to_device(hg);
      st.res = gc::all_reduce_hierarchical(
          comm, groups, src,
          gc::tensor_view<float const>(std::span<float const>(floats(g, hg.size())), id),
          floats(out, n), context_for(src, r, step), opt);
    }
    st.out = to_host(out, n);
    if (auto const shard = shard_of(r)) st.residual = residual_of(src, *shard);
    got[static_cast<std::size_t>(r)] = std::move(st);
  }));
  return {std::move(want), std::move(got)};
}

// Codecs of each family: summable (fp16, int8 stochastic, onebit, QSGD), gathered (top-k) and
// shared support (scaled random-k).
template <class Fn>
void for_each_hierarchical_codec(Fn&& fn) {
  using rd = gc::int8_rounding;
  fn("fp16", gc::fp16_codec{}, gc::cuda::fp16_codec{});
  fn("int8:bucket=100,rounding=stochastic", gc::int8_codec{100, rd::stochastic},
     gc::cuda::int8_codec{100, rd::stochastic});
  fn("onebit", gc::onebit_codec{}, gc::cuda::onebit_codec{});
  fn("qsgd", gc::qsgd_codec{}, gc::cuda::qsgd_codec{});
  fn("topk:ratio=0.1", gc::topk_codec::ratio(0.1), gc::cuda::topk_codec::ratio(0.1));
  fn("randomk:ratio=0.25,scale=true", gc::scaled_random_k_codec::ratio(0.25),
     gc::cuda::scaled_random_k_codec::ratio(0.25));
}

char const* format_name(gc::dense_format f) {
  return f == gc::dense_format::f32 ? "f32" : f == gc::dense_format::f16 ? "f16" : "bf16";
}

}  // namespace

TEST_CASE("cuda hierarchical: device codecs over split communicators equal the CPU hierarchical all-reduce",
          "[cuda][hierarchical]") {
  std::size_t const n = 1031;
  for_each_hierarchical_codec([&](char const* name, auto cpu, auto dev) {
    using dev_codec = decltype(dev);
    for (shape const& s : shapes()) {
      for (int lanes : {0, 1}) {
        for (gc::dense_format intra : {gc::dense_format::f32, gc::dense_format::f16, gc::dense_format::bf16}) {
          // every format with the first codec; the others at float32 and bfloat16
          if (intra == gc::dense_format::f16 && std::string(name) != "fp16") continue;
          gc::hierarchical_options opt;
          opt.nodes = s.nodes;
          opt.lanes = lanes;
          opt.intra = intra;
          opt.op = lanes == 0 ? gc::reduction::average : gc::reduction::sum;
          INFO(name << ", " << s.name << ", lanes " << lanes << ", intra " << format_name(intra));
          {
            INFO("no feedback, two steps");
            traffic log;
            auto const [want, got] = run_both([&] { return cpu; },
                                              [&] { return gc::cuda::stream_codec<dev_codec>(dev); },
                                              s, n, opt, 2, log);
            expect_same(want, got);
            CHECK(log.mixed == 0);
            CHECK(log.device_ops > 0);
            CHECK(log.host_max <= 96);  // control messages only: agreement and outcome rounds
          }
          {
            INFO("residual feedback on the owners, three steps");
            traffic log;
            auto const [want, got] = run_both(
                [&] { return gc::compressor<decltype(cpu), gc::residual_feedback>(cpu); },
                [&] { return gc::cuda::device_compressor<dev_codec>(gc::cuda::stream_codec<dev_codec>(dev)); },
                s, n, opt, 3, log);
            expect_same(want, got);
            CHECK(log.mixed == 0);
          }
        }
      }
    }
  });
}

TEST_CASE("cuda hierarchical: ranks without a gradient contribute zeros, as on the CPU",
          "[cuda][hierarchical]") {
  for (shape const& s : {shapes()[0], shapes()[1]}) {
    for (gc::dense_format intra : {gc::dense_format::f32, gc::dense_format::bf16}) {
      INFO(s.name << ", intra " << format_name(intra));
      gc::hierarchical_options opt;
      opt.nodes = s.nodes;
      opt.intra = intra;
      traffic log;
      auto const [want, got] = run_both([] { return gc::int8_codec{}; },
                                        [] { return gc::cuda::stream_codec<gc::cuda::int8_codec>(); },
                                        s, 517, opt, 1, log, {1, 2});
      expect_same(want, got);
      CHECK(log.mixed == 0);
    }
  }
}

TEST_CASE("cuda hierarchical: failures end the step alike on both backends, state kept",
          "[cuda][hierarchical]") {
  shape const s = shapes()[0];  // 2 nodes of 2: ranks 0 and 2 own shard 0, 1 and 3 shard 1
  std::size_t const n = 300;
  using dev_source = gc::cuda::device_compressor<gc::cuda::int8_codec>;
  using cpu_source = gc::compressor<gc::int8_codec, gc::residual_feedback>;
  struct bad {
    char const* name;
    int culprit;
  };
  for (bad const b : {bad{"a NaN in rank 3's gradient", 3}, bad{"checksum with a device source", -1},
                      bad{"a lane communicator that does not match the grouping", 2}}) {
    INFO(b.name);
    std::string const what = b.name;
    gc::hierarchical_options opt;
    opt.nodes = s.nodes;
    std::vector<std::vector<float>> residual_cpu(4), residual_dev(4), before_cpu(4), before_dev(4);
    auto step_grad = [&](int r, std::uint32_t t) {
      std::vector<float> g = gradient(n, r, t);
      if (t == 1 && r == b.culprit && what.starts_with("a NaN")) g[17] = std::numeric_limits<float>::quiet_NaN();
      return g;
    };
    auto shard = [&](int r) { return gc::hierarchical_shard_id(id, r % 2, 2); };
    std::vector<thrown> const cpu_thrown = gct::run_failing<false>(4, [&](auto& comm, int r) {
      cpu_source src{gc::int8_codec{}};
      std::vector<float> out(n);
      gc::hierarchical_options o = opt;
      for (std::uint32_t t = 0; t < 2; ++t) {
        if (t == 1) {
          before_cpu[static_cast<std::size_t>(r)] = residual_of(src, shard(r));
          if (what.starts_with("checksum")) o.checksum = true;
        }
        std::vector<float> const g = step_grad(r, t);
        try {
          gc::all_reduce_hierarchical(comm, src, gc::tensor_view<float const>(std::span<float const>(g), id),
                                      std::span<float>(out), context_for(src, r, t), o);
        } catch (...) {
          residual_cpu[static_cast<std::size_t>(r)] = residual_of(src, shard(r));
          throw;
        }
      }
      residual_cpu[static_cast<std::size_t>(r)] = residual_of(src, shard(r));
    });
    split_worlds const sub(s.nodes, 4, 0);
    traffic log;
    std::vector<thrown> const dev_thrown = gct::run_failing<true>(4, [&](auto& comm, int r) {
      emulated_nccl node(sub.node(r), log);
      emulated_nccl lane(*sub.lane(r), log);
      emulated_nccl wrong(*sub.lane(r == 2 ? 1 : r), log);  // rank 2 (lane 0) given lane 1's
      dev_source src{gc::cuda::stream_codec<gc::cuda::int8_codec>()};
      gc::cuda::device_buffer out = to_device(std::vector<float>(n));
      gc::hierarchical_options o = opt;
      for (std::uint32_t t = 0; t < 2; ++t) {
        gc::hierarchical_groups<emulated_nccl> groups{&node, &lane};
        if (t == 1) {
          before_dev[static_cast<std::size_t>(r)] = residual_of(src, shard(r));
          if (what.starts_with("checksum")) o.checksum = true;
          if (what.starts_with("a lane") && r == b.culprit) groups.lane = &wrong;
        }
        std::vector<float> const hg = step_grad(r, t);
        gc::cuda::device_buffer g = to_device(hg);
        try {
          gc::all_reduce_hierarchical(comm, groups, src,
                                      gc::tensor_view<float const>(std::span<float const>(floats(g, n)), id),
                                      floats(out, n), context_for(src, r, t), o);
        } catch (...) {
          residual_dev[static_cast<std::size_t>(r)] = residual_of(src, shard(r));
          throw;
        }
      }
      residual_dev[static_cast<std::size_t>(r)] = residual_of(src, shard(r));
    });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      auto const ur = static_cast<std::size_t>(r);
      if (what.starts_with("a lane")) {
        // the CPU has no such communicators: its step succeeds; the device one is refused
        CHECK(cpu_thrown[ur] == thrown::nothing);
        CHECK(dev_thrown[ur] == (r == b.culprit ? thrown::config : thrown::comm));
      } else if (what.starts_with("checksum")) {
        CHECK(cpu_thrown[ur] == thrown::nothing);  // the CPU takes checksums
        CHECK(dev_thrown[ur] == thrown::config);
      } else {
        CHECK(dev_thrown[ur] == cpu_thrown[ur]);
        CHECK(cpu_thrown[ur] != thrown::nothing);
      }
      // a failed step keeps every residual; the device's equal the CPU's
      if (dev_thrown[ur] != thrown::nothing) CHECK(same_bits(residual_dev[ur], before_dev[ur]));
      CHECK(same_bits(before_dev[ur], before_cpu[ur]));
    }
  }
}

namespace {

std::vector<std::size_t> const pipeline_sizes = {333, 40, 1000};  // 40 goes dense

struct pipeline_rank {
  std::vector<std::vector<float>> out;
  std::vector<std::byte> saved;
  gc::pipeline_stats stats;
};

std::vector<float> pipeline_gradient(std::size_t t, int r, std::uint32_t step) {
  return gct::gradient_of(pipeline_sizes[t], 0x9e37u + 7919u * static_cast<unsigned>(r) + 131u * step + 17u * t);
}

template <class Comm, class Views>
pipeline_rank pipeline_step(Comm& comm, gc::gradient_pipeline& pipe, Views& views) {
  pipeline_rank st;
  st.stats = pipe.step(comm, views);
  return st;
}

template <class D>
gc::gradient_pipeline device_pipeline(gc::pipeline_options const& o, D const& dev) {
  if (o.feedback == "residual") return gc::gradient_pipeline(o, gc::cuda::device_compressor<D>(gc::cuda::stream_codec<D>(dev)));
  return gc::gradient_pipeline(o, gc::cuda::stream_codec<D>(dev));
}

void give_groups(gc::gradient_pipeline& pipe, split_worlds const& sub, int r, traffic& log) {
  std::optional<gc::any_communicator> lane;
  if (auto l = sub.lane(r)) lane.emplace(emulated_nccl(*l, log));
  pipe.set_hierarchical_groups(gc::any_communicator(emulated_nccl(sub.node(r), log)), std::move(lane));
}

// `steps` steps of w CPU pipelines and w device pipelines (given split communicators) with
// `o`, the same gradients: every output, save() and the statistics alike after every step.
template <class D>
void compare_pipelines(gc::pipeline_options const& o, D const& dev, shape const& s, std::deque<gc::gradient_pipeline>& cpus,
                       std::deque<gc::gradient_pipeline>& devs, std::uint32_t first, int steps, traffic& log) {
  int const w = s.ranks;
  for (std::uint32_t step = first; step < first + static_cast<std::uint32_t>(steps); ++step) {
    INFO("step " << step);
    std::vector<pipeline_rank> want(static_cast<std::size_t>(w)), got(want.size());
    REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
      int const r = comm.rank();
      std::vector<std::vector<float>> g;
      std::vector<gc::tensor_view<float>> views;
      for (std::size_t t = 0; t < pipeline_sizes.size(); ++t) g.push_back(pipeline_gradient(t, r, step));
      for (std::size_t t = 0; t < g.size(); ++t) views.emplace_back(std::span<float>(g[t]), gc::tensor_id{static_cast<std::uint32_t>(t)});
      pipeline_rank st = pipeline_step(comm, cpus[static_cast<std::size_t>(r)], views);
      st.out = g;
      st.saved = cpus[static_cast<std::size_t>(r)].save();
      want[static_cast<std::size_t>(r)] = std::move(st);
    }));
    REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& inner) {
      emulated_nccl comm(inner, log);
      int const r = comm.rank();
      std::vector<gc::cuda::device_buffer> bufs;
      std::vector<gc::tensor_view<float>> views;
      for (std::size_t t = 0; t < pipeline_sizes.size(); ++t) {
        bufs.push_back(to_device(pipeline_gradient(t, r, step)));
        views.emplace_back(floats(bufs.back(), pipeline_sizes[t]), gc::tensor_id{static_cast<std::uint32_t>(t)});
      }
      pipeline_rank st = pipeline_step(comm, devs[static_cast<std::size_t>(r)], views);
      for (std::size_t t = 0; t < bufs.size(); ++t) st.out.push_back(to_host(bufs[t], pipeline_sizes[t]));
      st.saved = devs[static_cast<std::size_t>(r)].save();
      got[static_cast<std::size_t>(r)] = std::move(st);
    }));
    for (std::size_t r = 0; r < want.size(); ++r) {
      INFO("rank " << r);
      for (std::size_t t = 0; t < pipeline_sizes.size(); ++t) CHECK(same_bits(want[r].out[t], got[r].out[t]));
      CHECK(want[r].saved == got[r].saved);  // the owners' residuals, keyed by shard
      CHECK(want[r].stats.bytes_sent == got[r].stats.bytes_sent);
      CHECK(want[r].stats.buckets == got[r].stats.buckets);
      CHECK(want[r].stats.compressed_tensors == got[r].stats.compressed_tensors);
      CHECK(got[r].stats.compressed_tensors == 2);
      CHECK(want[r].stats.factor == got[r].stats.factor);
      CHECK(want[r].stats.guard == got[r].stats.guard);
    }
    CHECK(log.mixed == 0);
  }
  (void)o, (void)dev;
}

}  // namespace

TEST_CASE("cuda hierarchical: gradient_pipeline with a device source over split communicators equals the CPU pipeline",
          "[cuda][hierarchical][pipeline]") {
  auto run = [](char const* spec, auto dev, std::string const& feedback, shape const& s, int lanes) {
    INFO(spec << ", feedback " << feedback << ", " << s.name << ", lanes " << lanes);
    gc::pipeline_options o;
    o.codec = spec;
    o.feedback = feedback;
    o.seed = 5;
    o.measured_timing = false;
    o.buckets.min_compress_elements = 100;
    o.hierarchical.nodes = s.nodes;
    o.hierarchical.lanes = lanes;
    o.hierarchical.intra = gc::dense_format::bf16;
    split_worlds const sub(s.nodes, s.ranks, lanes);
    traffic log;
    std::deque<gc::gradient_pipeline> cpus, devs;
    for (int r = 0; r < s.ranks; ++r) {
      cpus.emplace_back(o);
      devs.push_back(device_pipeline(o, dev));
      give_groups(devs.back(), sub, r, log);
    }
    compare_pipelines(o, dev, s, cpus, devs, 0, 3, log);
    CHECK(log.device_ops > 0);
    // Resuming: each CPU checkpoint loaded into a fresh device pipeline, which saves it back
    // and takes the next step as the CPU pipeline does.
    std::deque<gc::gradient_pipeline> devs2;
    for (int r = 0; r < s.ranks; ++r) {
      std::vector<std::byte> const saved = cpus[static_cast<std::size_t>(r)].save();
      devs2.push_back(device_pipeline(o, dev));
      give_groups(devs2.back(), sub, r, log);
      devs2.back().load(saved);
      CHECK(devs2.back().save() == saved);
    }
    compare_pipelines(o, dev, s, cpus, devs2, 3, 1, log);
  };
  using rd = gc::int8_rounding;
  for (shape const& s : {shapes()[0], shapes()[1]}) {
    for (int lanes : {0, 1}) {
      run("int8:bucket=100,rounding=stochastic", gc::cuda::int8_codec{100, rd::stochastic}, "residual", s, lanes);
      run("topk:ratio=0.1", gc::cuda::topk_codec::ratio(0.1), "residual", s, lanes);
      run("fp16", gc::cuda::fp16_codec{}, "none", s, lanes);
    }
  }
}

TEST_CASE("cuda hierarchical: a device pipeline without its node and lane communicators is refused on every rank",
          "[cuda][hierarchical][pipeline]") {
  gc::pipeline_options o;
  o.codec = "int8";
  o.feedback = "residual";
  o.buckets.min_compress_elements = 100;
  o.hierarchical.nodes = gc::node_grouping::uniform(2);
  std::vector<gc::gradient_pipeline> pipes;
  for (int r = 0; r < 4; ++r) pipes.push_back(device_pipeline(o, gc::cuda::int8_codec{}));
  std::vector<thrown> const got = gct::run_failing<true>(4, [&](auto& comm, int r) {
    gc::cuda::device_buffer g = to_device(pipeline_gradient(0, r, 0));
    std::vector<gc::tensor_view<float>> views{gc::tensor_view<float>(floats(g, pipeline_sizes[0]), gc::tensor_id{0})};
    pipes[static_cast<std::size_t>(r)].step(comm, views);
  });
  for (thrown t : got) CHECK(t == thrown::config);
  for (auto const& p : pipes) CHECK(p.step_count() == 0);
}
