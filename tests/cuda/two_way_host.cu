// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Two-way compression (collective/two_way.hpp) with device codecs, checked on a machine without
// a GPU, against the CPU collective with the CPU codecs of the same formats.
//
// What is real and what is emulated (as in collective_host.cu): real are the two-way collective
// with its device memory space, `two_way_compressor` with `cuda::device_residual_feedback`, the
// device codecs' header code, checks and passes, and the CPU collective they are compared with.
// Emulated: this file is built with Thrust's CPP device system, so "device" memory is host
// memory that cuda/memory.cuh records as device allocations, kernels run on the calling thread
// and streams are ignored; the communicator is `emulated_nccl` (emulated_nccl.cuh), an
// in-process communicator under the NCCL adapter's contract that records which operations
// carried device payloads and which host control messages.
//
// Compared byte for byte over several steps on 2, 3 and 4 ranks: every rank's result, and with
// error feedback every worker and server residual; with bad inputs, the exception type each
// rank throws, and residuals that stay as they were.

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "../unit/support/rank_check.hpp"
#include "device_buffers.cuh"
#include "emulated_nccl.cuh"

#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/collective/parameter_server.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/cuda/cast.cuh>
#include <gradcomp/cuda/collective.cuh>
#include <gradcomp/cuda/dithering.cuh>
#include <gradcomp/cuda/int8.cuh>
#include <gradcomp/cuda/memory.cuh>
#include <gradcomp/cuda/onebit.cuh>
#include <gradcomp/feedback/policies.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#if GRADCOMP_CUDA_ON_GPU
#  error "two_way_host.cu is the host emulation: build it with THRUST_DEVICE_SYSTEM_CPP"
#endif

using gc::cuda::memory_kind;
using gc::cuda::memory_kind_of;
using namespace gct;  // NOLINT(google-build-using-namespace): the test support

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers: device copies of host vectors, inputs, and what each rank ends with.

// Gradient of rank r at a step (device_buffers.cuh's inputs).
std::vector<float> gradient(std::size_t n, int r, std::uint32_t step) {
  return gct::gradient_of(n, 1000u * static_cast<unsigned>(r) + 17u * step + n);
}

gc::codec_context rank_context(int r, std::uint32_t step, bool shared = false) {
  return gct::rank_context_of(r, step, 0x7a5e0000u, shared);
}

gc::shard_key key(gc::tensor_id t, std::size_t s, int w) {
  return gc::shard_key{t, static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(w)};
}

// One rank after a step: its result, the worker residual of every shard, the server residual
// of its own shard (host copies) and what the collective reported.
struct rank_state {
  std::vector<float> out;
  std::vector<std::vector<float>> worker;
  std::vector<float> server;
  gc::collective_result res;
};

template <class TwoWay>
void read_residuals(TwoWay const& tw, gc::tensor_id t, int r, int w, rank_state& st) {
  st.worker.clear();
  for (std::size_t s = 0; s < static_cast<std::size_t>(w); ++s)
    st.worker.push_back(to_host(tw.worker_residual(key(t, s, w))));
  st.server = to_host(tw.server_residual(key(t, static_cast<std::size_t>(r), w)));
}

template <class TwoWay>
bool residuals_on_device(TwoWay const& tw, gc::tensor_id t, int r, int w) {
  auto on_device = [](std::span<float const> e) {
    return e.empty() || memory_kind_of(e.data()) == memory_kind::device;
  };
  for (std::size_t s = 0; s < static_cast<std::size_t>(w); ++s) {
    if (!on_device(tw.worker_residual(key(t, s, w)))) return false;
  }
  return on_device(tw.server_residual(key(t, static_cast<std::size_t>(r), w)));
}

void expect_same(std::vector<rank_state> const& cpu, std::vector<rank_state> const& dev) {
  REQUIRE(cpu.size() == dev.size());
  for (std::size_t r = 0; r < cpu.size(); ++r) {
    INFO("rank " << r);
    CHECK(same_bits(cpu[r].out, dev[r].out));
    REQUIRE(cpu[r].worker.size() == dev[r].worker.size());
    for (std::size_t s = 0; s < cpu[r].worker.size(); ++s) {
      INFO("worker residual of shard " << s);
      CHECK(same_bits(cpu[r].worker[s], dev[r].worker[s]));
    }
    CHECK(same_bits(cpu[r].server, dev[r].server));
    CHECK(cpu[r].res.path == dev[r].res.path);
    CHECK(cpu[r].res.packet_bytes == dev[r].res.packet_bytes);
    CHECK(cpu[r].res.wire_bytes == dev[r].res.wire_bytes);
  }
}

// Runs `steps` steps of all_reduce_two_way on w ranks with the CPU two-way compressor of
// `codec` and feedback F, and with the device one of `dev` and the device counterpart of F
// (the codec's own residual feedback, or no_feedback); compares every step. `contributes(r,
// step)` false: rank r passes an empty gradient at that step.
template <bool Feedback, class CpuCodec, class DevCodec, class Contributes>
void compare_runs(CpuCodec const& codec, DevCodec const& dev, int w, std::size_t n,
                  gc::reduction op, int steps, Contributes&& contributes) {
  using cpu_fb = std::conditional_t<Feedback, gc::residual_feedback, gc::no_feedback>;
  using dev_codec = gc::cuda::stream_codec<DevCodec>;
  using dev_fb =
      std::conditional_t<Feedback, gc::residual_feedback_for<dev_codec>, gc::no_feedback>;
  using cpu_tw = gc::two_way_compressor<CpuCodec, cpu_fb, cpu_fb>;
  using dev_tw = gc::two_way_compressor<dev_codec, dev_fb, dev_fb>;
  gc::tensor_id const id{21};
  std::vector<cpu_tw> cpus(static_cast<std::size_t>(w), cpu_tw(codec));
  std::vector<dev_tw> devs;
  for (int r = 0; r < w; ++r) devs.emplace_back(dev_codec(dev));
  auto cpu = [&](gc::in_process_communicator& comm, int r, std::uint32_t s) {
    std::vector<float> const g =
        contributes(r, static_cast<int>(s)) ? gradient(n, r, s) : std::vector<float>{};
    std::vector<float> out(n, -7.0f);
    rank_state st;
    st.res = gc::all_reduce_two_way(comm, cpus[static_cast<std::size_t>(r)],
                                    gc::tensor_view<float const>(std::span<float const>(g), id),
                                    std::span<float>(out),
                                    rank_context(r, s, gct::shared_support(cpus[0].worker_codec())), {.op = op});
    st.out = std::move(out);
    read_residuals(cpus[static_cast<std::size_t>(r)], id, r, w, st);
    return st;
  };
  auto device = [&](emulated_nccl& comm, int r, std::uint32_t s) {
    std::vector<float> const hg =
        contributes(r, static_cast<int>(s)) ? gradient(n, r, s) : std::vector<float>{};
    gc::cuda::device_buffer g = to_device(hg);
    gc::cuda::device_buffer out = to_device(std::vector<float>(n, -7.0f));
    rank_state st;
    st.res = gc::all_reduce_two_way(
        comm, devs[static_cast<std::size_t>(r)],
        gc::tensor_view<float const>(std::span<float const>(floats(g, hg.size())), id),
        floats(out, n), rank_context(r, s, gct::shared_support(devs[0].worker_codec())), {.op = op});
    st.out = to_host(floats(out, n));
    RANK_REQUIRE(residuals_on_device(devs[static_cast<std::size_t>(r)], id, r, w));
    read_residuals(devs[static_cast<std::size_t>(r)], id, r, w, st);
    return st;
  };
  compare_steps<rank_state>(w, steps, cpu, device,
                            [&](auto const& want, auto const& got, traffic const& log) {
                              expect_same(want, got);
                              // Payloads on the device (the all-to-all of worker packets, the
                              // all-gather of server packets), control messages on the host (two
                              // agreement rounds, the outcome round): per rank two and three
                              // operations, never mixed, each message at most a report of 32
                              // bytes plus one 8-byte size per rank.
                              CHECK(log.device_ops == 2 * static_cast<std::size_t>(w));
                              CHECK(log.host_ops == 3 * static_cast<std::size_t>(w));
                              CHECK(log.host_max <= 32 + 8 * static_cast<std::size_t>(w));
                              CHECK(log.mixed == 0);
                            });
}

// The parameter-server mode (collective/parameter_server.hpp) on w ranks, the last k of them
// servers, with the CPU two-way compressor of `codec` and the device one of `dev` (residual
// feedback on both sides): each worker's result and worker residuals, each server's residual,
// compared step by step, and the device payloads (packets) apart from the host reports.
template <class CpuCodec, class DevCodec>
void compare_ps(CpuCodec const& codec, DevCodec const& dev, int w, int k, std::size_t n,
                gc::reduction op, int steps) {
  using dev_codec = gc::cuda::stream_codec<DevCodec>;
  using cpu_tw = gc::two_way_compressor<CpuCodec>;
  using dev_tw = gc::two_way_compressor<dev_codec>;
  gc::tensor_id const id{23};
  gc::ps_options const opt{.servers = k, .op = op};
  int const workers = w - k;
  std::vector<cpu_tw> cpus(static_cast<std::size_t>(w), cpu_tw(codec));
  std::vector<dev_tw> devs;
  for (int r = 0; r < w; ++r) devs.emplace_back(dev_codec(dev));
  auto residuals = [&](auto const& tw, int r, rank_state& st) {
    st.worker.clear();
    if (r < workers) {
      for (std::size_t s = 0; s < static_cast<std::size_t>(k); ++s)
        st.worker.push_back(to_host(tw.worker_residual(key(id, s, k))));
    } else {
      st.server = to_host(tw.server_residual(key(id, static_cast<std::size_t>(r - workers), k)));
    }
  };
  auto cpu = [&](gc::in_process_communicator& comm, int r, std::uint32_t s) {
    rank_state st;
    gc::codec_context const ctx = rank_context(r, s, gct::shared_support(cpus[0].worker_codec()));
    auto& tw = cpus[static_cast<std::size_t>(r)];
    if (r < workers) {
      std::vector<float> const g = gradient(n, r, s);
      std::vector<float> out(n, -7.0f);
      st.res = gc::ps_push_pull(comm, tw, gc::tensor_view<float const>(std::span<float const>(g), id),
                                std::span<float>(out), ctx, opt);
      st.out = std::move(out);
    } else {
      st.res = gc::ps_serve(comm, tw, id, n, ctx, opt);
    }
    residuals(tw, r, st);
    return st;
  };
  auto device = [&](emulated_nccl& comm, int r, std::uint32_t s) {
    rank_state st;
    gc::codec_context const ctx = rank_context(r, s, gct::shared_support(devs[0].worker_codec()));
    auto& tw = devs[static_cast<std::size_t>(r)];
    if (r < workers) {
      std::vector<float> const hg = gradient(n, r, s);
      gc::cuda::device_buffer g = to_device(hg);
      gc::cuda::device_buffer out = to_device(std::vector<float>(n, -7.0f));
      st.res = gc::ps_push_pull(comm, tw, gc::tensor_view<float const>(std::span<float const>(floats(g, n)), id),
                                floats(out, n), ctx, opt);
      st.out = to_host(floats(out, n));
    } else {
      st.res = gc::ps_serve(comm, tw, id, n, ctx, opt);
    }
    RANK_REQUIRE(residuals_on_device(tw, id, r < workers ? 0 : r - workers, k));
    residuals(tw, r, st);
    return st;
  };
  compare_steps<rank_state>(w, steps, cpu, device, [&](auto const& want, auto const& got, traffic const& log) {
    expect_same(want, got);
    CHECK(log.device_ops > 0);
    CHECK(log.mixed == 0);
    CHECK(log.host_max <= 48);  // reports (32 bytes) and the outcome round
  });
}

template <class T>
concept saves_state = requires(T const& t, T& m, std::span<std::byte const> b) {
  t.save();
  m.load(b);
};

}  // namespace

TEST_CASE("cuda two-way: device codecs name their device residual feedback", "[cuda][two_way]") {
  using dev = gc::cuda::stream_codec<gc::cuda::int8_codec>;
  STATIC_REQUIRE(
      std::is_same_v<gc::residual_feedback_for<dev>, gc::cuda::device_residual_feedback>);
  STATIC_REQUIRE(std::is_same_v<gc::residual_feedback_for<gc::int8_codec>, gc::residual_feedback>);
  STATIC_REQUIRE(gc::one_phase_feedback<gc::cuda::device_residual_feedback, dev>);
  STATIC_REQUIRE(gc::one_phase_feedback<gc::no_feedback, dev>);
  STATIC_REQUIRE(gc::one_phase_feedback<gc::residual_feedback, gc::int8_codec>);
  // The CPU default is unchanged: the same type as before.
  STATIC_REQUIRE(
      std::is_same_v<
          gc::two_way_compressor<gc::int8_codec>,
          gc::two_way_compressor<gc::int8_codec, gc::residual_feedback, gc::residual_feedback>>);
  STATIC_REQUIRE(std::is_same_v<gc::two_way_compressor<dev>::memory_type, gc::cuda::device_memory>);
  STATIC_REQUIRE(gc::two_way_compressor<gc::int8_codec>::memory_type::on_host);
  // Both save and load their state (a device codec's through host copies).
  STATIC_REQUIRE(saves_state<gc::two_way_compressor<gc::int8_codec>>);
  STATIC_REQUIRE(saves_state<gc::two_way_compressor<dev>>);
}

TEST_CASE("cuda two-way: all_reduce_two_way with device error feedback equals the CPU collective",
          "[cuda][two_way][feedback]") {
  for_each_codec_pair([](char const* name, auto cpu, auto dev) {
    for (int w : {2, 3, 4}) {
      for (std::size_t n : {std::size_t{3}, std::size_t{2053}}) {
        gc::reduction const op = w == 3 ? gc::reduction::sum : gc::reduction::average;
        INFO(name << ", " << w << " ranks, n = " << n);
        compare_runs<true>(cpu, dev, w, n, op, 3, [](int, int) { return true; });
      }
    }
  });
}

TEST_CASE("cuda two-way: all_reduce_two_way without error feedback equals the CPU collective",
          "[cuda][two_way]") {
  for_each_codec_pair([](char const* name, auto cpu, auto dev) {
    for (int w : {2, 4}) {
      INFO(name << ", " << w << " ranks");
      compare_runs<false>(cpu, dev, w, 1000, gc::reduction::average, 2,
                          [](int, int) { return true; });
    }
  });
}

TEST_CASE("cuda two-way: a rank without a gradient, on device memory, as on the CPU",
          "[cuda][two_way][feedback]") {
  for_each_codec_pair([](char const* name, auto cpu, auto dev) {
    INFO(name);
    // Rank 1 sits out the second step: its worker residuals stay, it still serves its shard.
    compare_runs<true>(cpu, dev, 3, 777, gc::reduction::average, 3,
                       [](int r, int step) { return !(r == 1 && step == 1); });
  });
}

TEST_CASE("cuda two-way: the parameter-server mode with device codecs equals the CPU's",
          "[cuda][two_way][parameter_server]") {
  for_each_codec_pair([](char const* name, auto cpu, auto dev) {
    for (auto const& [w, k] : {std::pair{3, 1}, std::pair{5, 2}}) {
      INFO(name << ", " << w - k << " workers, " << k << " servers");
      compare_ps(cpu, dev, w, k, 2053, gc::reduction::average, 3);
      compare_ps(cpu, dev, w, k, 5, gc::reduction::sum, 2);
    }
  });
  // The checksum option reads payloads on the host: a config_error on every rank of a device run.
  using dev_tw = gc::two_way_compressor<gc::cuda::stream_codec<gc::cuda::int8_codec>>;
  std::vector<dev_tw> devs;
  for (int r = 0; r < 3; ++r) devs.emplace_back(gc::cuda::stream_codec<gc::cuda::int8_codec>{});
  auto const got = run_failing<true>(3, [&](auto& comm, int r) {
    gc::ps_options const opt{.servers = 1, .checksum = true};
    if (r < 2) {
      gc::cuda::device_buffer g = to_device(gradient(100, r, 0)), out = to_device(std::vector<float>(100));
      (void)gc::ps_push_pull(comm, devs[static_cast<std::size_t>(r)],
                             gc::tensor_view<float const>(std::span<float const>(floats(g, 100)), gc::tensor_id{1}),
                             floats(out, 100), rank_context(r, 0), opt);
    } else {
      (void)gc::ps_serve(comm, devs[2], gc::tensor_id{1}, 100, rank_context(r, 0), opt);
    }
  });
  for (thrown t : got) CHECK(t != thrown::nothing);
  CHECK(got[0] == thrown::config);
}

TEST_CASE(
    "cuda two-way: reduce_shard sums, scales and re-compresses on device memory as on the CPU",
    "[cuda][two_way][feedback]") {
  std::size_t const n = 1500;
  gc::int8_codec const cpu_codec;
  gc::cuda::stream_codec<gc::cuda::int8_codec> const dev_codec;
  gc::two_way_compressor<gc::int8_codec> cpu(cpu_codec);
  gc::two_way_compressor<gc::cuda::stream_codec<gc::cuda::int8_codec>> dev(dev_codec);
  gc::shard_key const k{gc::tensor_id{5}, 1, 3};
  for (std::uint32_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    gc::codec_context const ctx = rank_context(0, step);
    // Three worker packets (one rank sent nothing: an empty packet), written by the CPU codec.
    std::vector<std::vector<std::byte>> host_packets;
    for (int r = 0; r < 3; ++r) {
      std::vector<float> const g = gradient(n, r, step);
      std::vector<std::byte> p(cpu_codec.max_compressed_bytes(n));
      p.resize(cpu_codec.compress(gc::tensor_view<float const>(std::span<float const>(g)),
                                  std::span<std::byte>(p), ctx));
      if (r == 2) p.clear();
      host_packets.push_back(std::move(p));
    }
    std::vector<gc::cuda::device_buffer> dev_packets;
    std::vector<std::span<std::byte const>> hp, dp;
    for (auto const& p : host_packets) {
      gc::cuda::device_buffer b;
      b.resize(p.size());
      if (!p.empty()) std::memcpy(b.data(), p.data(), p.size());
      hp.emplace_back(p);
      dp.push_back(std::as_const(b).span());
      dev_packets.push_back(std::move(b));
    }
    std::vector<float> got_cpu, got_dev;
    std::vector<std::byte> out_cpu(cpu_codec.max_compressed_bytes(n));
    gc::cuda::device_buffer out_dev;
    out_dev.resize(out_cpu.size());
    std::size_t const bc =
        cpu.reduce_shard(hp, n, k, 0.5f, std::span<std::byte>(out_cpu), ctx, &got_cpu);
    std::size_t const bd = dev.reduce_shard(dp, n, k, 0.5f, out_dev.span(), ctx, &got_dev);
    REQUIRE(bc == bd);
    CHECK(std::memcmp(out_cpu.data(), out_dev.data(), bc) == 0);
    CHECK(same_bits(got_cpu, got_dev));
    CHECK(same_bits(to_host(cpu.server_residual(k)), to_host(dev.server_residual(k))));
    CHECK(memory_kind_of(dev.server_residual(k).data()) == memory_kind::device);
  }
  // The saved state: the CPU's bytes; loaded into a fresh device compressor, residuals on the
  // device with the same bits; a truncated state is a format_error that changes nothing.
  std::vector<std::byte> const saved = cpu.save();
  CHECK(dev.save() == saved);
  gc::two_way_compressor<gc::cuda::stream_codec<gc::cuda::int8_codec>> fresh(dev_codec);
  fresh.load(saved);
  CHECK(fresh.save() == saved);
  CHECK(memory_kind_of(fresh.server_residual(k).data()) == memory_kind::device);
  CHECK(same_bits(to_host(cpu.server_residual(k)), to_host(fresh.server_residual(k))));
  std::vector<std::byte> truncated = saved;
  truncated.pop_back();
  CHECK_THROWS_AS(fresh.load(truncated), gc::format_error);
  CHECK(fresh.save() == saved);
}

TEST_CASE("cuda two-way: bad inputs fail the device step as the CPU step, residuals kept",
          "[cuda][two_way][failure]") {
  using cpu_tw = gc::two_way_compressor<gc::int8_codec>;
  using dev_tw = gc::two_way_compressor<gc::cuda::stream_codec<gc::cuda::int8_codec>>;
  gc::tensor_id const id{3};
  for (int w : {2, 3, 4}) {
    INFO(w << " ranks");
    std::size_t const n = 999;
    std::vector<cpu_tw> cpus(static_cast<std::size_t>(w));
    std::vector<dev_tw> devs;
    for (int r = 0; r < w; ++r) devs.emplace_back(gc::cuda::stream_codec<gc::cuda::int8_codec>{});
    // One step of rank r with gradient hg (and an output of its size) on either backend.
    auto cpu_step = [&](gc::in_process_communicator& comm, int r, std::vector<float> const& hg,
                        gc::collective_options opt = {}, gc::tensor_id t = gc::tensor_id{3}) {
      std::vector<float> out(hg.size());
      gc::all_reduce_two_way(comm, cpus[static_cast<std::size_t>(r)],
                             gc::tensor_view<float const>(std::span<float const>(hg), t),
                             std::span<float>(out), rank_context(r, 1), opt);
    };
    auto dev_step = [&](emulated_nccl& comm, int r, std::vector<float> const& hg,
                        gc::collective_options opt = {}, gc::tensor_id t = gc::tensor_id{3}) {
      gc::cuda::device_buffer g = to_device(hg);
      gc::cuda::device_buffer out = to_device(std::vector<float>(hg.size()));
      gc::all_reduce_two_way(
          comm, devs[static_cast<std::size_t>(r)],
          gc::tensor_view<float const>(std::span<float const>(floats(g, hg.size())), t),
          floats(out, hg.size()), rank_context(r, 1), opt);
    };
    // A first step that succeeds everywhere, so that every residual exists.
    for (thrown t :
         run_failing<false>(w, [&](auto&comm, int r) { cpu_step(comm, r, gradient(n, r, 0)); })) {
      CHECK(t == thrown::nothing);
    }
    for (thrown t :
         run_failing<true>(w, [&](auto&comm, int r) { dev_step(comm, r, gradient(n, r, 0)); })) {
      CHECK(t == thrown::nothing);
    }
    std::vector<rank_state> before(static_cast<std::size_t>(w));
    for (int r = 0; r < w; ++r)
      read_residuals(devs[static_cast<std::size_t>(r)], id, r, w,
                     before[static_cast<std::size_t>(r)]);

    // Rank 1's tensor has another size. A tensor without residuals yet: the agreement round's
    // fingerprints differ, config_error on every rank. The tensor of the first step: rank 1's
    // worker residuals hold the old shard sizes, its own config_error, comm_error elsewhere.
    // Both as on the CPU.
    auto grad_of = [&](int r) { return gradient(r == 1 ? n + 1 : n, r, 1); };
    gc::tensor_id const fresh{33};
    auto const size_cpu =
        run_failing<false>(w, [&](auto& comm, int r) { cpu_step(comm, r, grad_of(r), {}, fresh); });
    auto const size_dev =
        run_failing<true>(w, [&](auto& comm, int r) { dev_step(comm, r, grad_of(r), {}, fresh); });
    CHECK(size_cpu == size_dev);
    for (thrown t : size_dev) CHECK(t == thrown::config);
    auto const state_cpu =
        run_failing<false>(w, [&](auto& comm, int r) { cpu_step(comm, r, grad_of(r)); });
    auto const state_dev =
        run_failing<true>(w, [&](auto& comm, int r) { dev_step(comm, r, grad_of(r)); });
    CHECK(state_cpu == state_dev);
    for (int r = 0; r < w; ++r)
      CHECK(state_dev[static_cast<std::size_t>(r)] == (r == 1 ? thrown::config : thrown::comm));

    // A NaN in rank 1's gradient: numeric_error there, comm_error elsewhere, as on the CPU.
    auto nan_of = [&](int r) {
      std::vector<float> g = gradient(n, r, 1);
      if (r == 1) g[n - 2] = std::nanf("");
      return g;
    };
    auto const nan_cpu =
        run_failing<false>(w, [&](auto& comm, int r) { cpu_step(comm, r, nan_of(r)); });
    auto const nan_dev =
        run_failing<true>(w, [&](auto& comm, int r) { dev_step(comm, r, nan_of(r)); });
    CHECK(nan_cpu == nan_dev);
    for (int r = 0; r < w; ++r)
      CHECK(nan_dev[static_cast<std::size_t>(r)] == (r == 1 ? thrown::numeric : thrown::comm));

    // The last rank disappears before the collective: comm_error on the others, as on the CPU.
    auto const gone_cpu = run_failing<false>(w, [&](auto& comm, int r) {
      if (r == w - 1) throw std::runtime_error("rank lost");
      cpu_step(comm, r, gradient(n, r, 1));
    });
    auto const gone_dev = run_failing<true>(w, [&](auto& comm, int r) {
      if (r == w - 1) throw std::runtime_error("rank lost");
      dev_step(comm, r, gradient(n, r, 1));
    });
    CHECK(gone_cpu == gone_dev);
    for (int r = 0; r + 1 < w; ++r) CHECK(gone_dev[static_cast<std::size_t>(r)] == thrown::comm);

    // The checksum option reads payloads on the host: config_error on every device rank.
    auto const sum_dev = run_failing<true>(
        w, [&](auto& comm, int r) { dev_step(comm, r, gradient(n, r, 1), {.checksum = true}); });
    for (thrown t : sum_dev) CHECK(t == thrown::config);

    // No failed step changed a residual (the steps that got as far as compressing were rolled
    // back from their device copies), and the fresh tensor has none.
    for (int r = 0; r < w; ++r) {
      INFO("rank " << r);
      rank_state after, none;
      read_residuals(devs[static_cast<std::size_t>(r)], id, r, w, after);
      auto const& b = before[static_cast<std::size_t>(r)];
      for (std::size_t s = 0; s < b.worker.size(); ++s)
        CHECK(same_bits(b.worker[s], after.worker[s]));
      CHECK(same_bits(b.server, after.server));
      CHECK(!b.server.empty());
      read_residuals(devs[static_cast<std::size_t>(r)], fresh, r, w, none);
      for (auto const& e : none.worker) CHECK(e.empty());
      CHECK(none.server.empty());
    }
  }
}
