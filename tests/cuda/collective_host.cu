// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Device codecs through the library's collectives, checked on a machine without a GPU.
//
// What is real and what is emulated here:
// - real: the collectives' code (collective/all_reduce.hpp with its device memory space), the
//   device codecs' header code, checks and passes (cuda/collective.cuh, cuda/*.cuh) and the
//   CPU collectives they are compared with;
// - host emulation (a mock of what needs a GPU): this file is built with Thrust's CPP device
//   system, so "device" memory is host memory that cuda/memory.cuh records as device
//   allocations, kernels run on the calling thread, and streams are ignored. The communicator
//   is `emulated_nccl` (emulated_nccl.cuh), an in-process communicator that follows the NCCL
//   adapter's contract (comm/nccl.cuh: any span may be host or device memory, told apart by its
//   pointer; a rank that fails or disappears fails every peer with comm_error) and records which
//   operations carried device payloads and which carried host control messages. NCCL itself, the
//   device staging of host messages, the timeout and abort run only in tests/cuda/nccl_comm.cu on a
//   GPU.
//
// Every device result is compared byte for byte with the CPU collective's on the same inputs,
// on 2, 3 and 4 ranks.

#define CATCH_CONFIG_MAIN
#define GCT_BACKEND "cuda/collective-cpp"
#include "codec_checks.cuh"

#include "../unit/support/rank_check.hpp"
#include "device_buffers.cuh"
#include "emulated_nccl.cuh"

#include <gradcomp/codec/format/support.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/cuda/collective.cuh>
#include <gradcomp/cuda/memory.cuh>
#include <gradcomp/cuda/powersgd.cuh>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <typeinfo>
#include <vector>

#if GRADCOMP_CUDA_ON_GPU
#  error "collective_host.cu is the host emulation: build it with THRUST_DEVICE_SYSTEM_CPP"
#endif

using gc::cuda::memory_kind;
using gc::cuda::memory_kind_of;

using gct::emulated_nccl;
using gct::floats;
using gct::run_failing;
using gct::same_bits;
using gct::thrown;
using gct::to_device;
using gct::to_host;
using gct::traffic;

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers: device copies of host vectors, and the two runs compared.

// Gradient of rank r at a step (device_buffers.cuh's inputs).
std::vector<float> gradient(std::size_t n, int r, std::uint32_t step) {
  return gct::gradient_of(n, 1000u * static_cast<unsigned>(r) + 17u * step + n);
}

gc::codec_context rank_context(int r, std::uint32_t step) {
  return gct::rank_context_of(r, step, 0x5eed0000u);
}

// The context of rank r for codec C: shared-support codecs need one seed on every rank (the
// collective checks it); the others get one seed per rank (independent rounding noise).
template <class C>
gc::codec_context context_for(int r, std::uint32_t step) {
  return rank_context(C::aggregation == gc::aggregation_kind::shared_support ? 0 : r, step);
}

struct rank_outcome {
  std::vector<float> out;
  gc::collective_result res;
};

// `contributes(r)` false: rank r passes an empty gradient.
template <class CpuCodec>
std::vector<rank_outcome> run_cpu(CpuCodec const& codec, int w, std::size_t n, gc::reduction op,
                                  std::vector<bool> const& contributes) {
  std::vector<rank_outcome> got(static_cast<std::size_t>(w));
  gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
    int const r = comm.rank();
    std::vector<float> const g =
        contributes[static_cast<std::size_t>(r)] ? gradient(n, r, 0) : std::vector<float>{};
    std::vector<float> out(n, -7.0f);
    gc::collective_options opt;
    opt.op = op;
    auto res = gc::all_reduce_compressed(
        comm, codec, gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{4}),
        std::span<float>(out), context_for<CpuCodec>(r, 0), opt);
    got[static_cast<std::size_t>(r)] = {std::move(out), res};
  });
  return got;
}

template <class CudaCodec>
std::vector<rank_outcome> run_device(CudaCodec const& codec, int w, std::size_t n, gc::reduction op,
                                     std::vector<bool> const& contributes, traffic& log) {
  std::vector<rank_outcome> got(static_cast<std::size_t>(w));
  gc::run_in_process(w, [&](gc::in_process_communicator& inner) {
    emulated_nccl comm(inner, log);
    int const r = comm.rank();
    gc::cuda::stream_codec<CudaCodec> const dc(codec);
    std::vector<float> const hg =
        contributes[static_cast<std::size_t>(r)] ? gradient(n, r, 0) : std::vector<float>{};
    gc::cuda::device_buffer g = to_device(hg);
    gc::cuda::device_buffer out = to_device(std::vector<float>(n, -7.0f));
    gc::collective_options opt;
    opt.op = op;
    auto res = gc::all_reduce_compressed(
        comm, dc,
        gc::tensor_view<float const>(std::span<float const>(floats(g, hg.size())),
                                     gc::tensor_id{4}),
        floats(out, n), context_for<gc::cuda::stream_codec<CudaCodec>>(r, 0), opt);
    got[static_cast<std::size_t>(r)] = {to_host(out, n), res};
  });
  return got;
}

void expect_same(std::vector<rank_outcome> const& cpu, std::vector<rank_outcome> const& dev) {
  REQUIRE(cpu.size() == dev.size());
  for (std::size_t r = 0; r < cpu.size(); ++r) {
    INFO("rank " << r);
    CHECK(same_bits(cpu[r].out, dev[r].out));
    CHECK(cpu[r].res.path == dev[r].res.path);
    CHECK(cpu[r].res.packet_bytes == dev[r].res.packet_bytes);
    CHECK(cpu[r].res.wire_bytes == dev[r].res.wire_bytes);
  }
}

// The configurations of codec_checks.cuh that the collective cases run (one of each family
// and variant; the full lists are covered codec by codec in host_backend.cu).
template <class Fn>
void for_each_collective_codec(Fn&& fn) {
  gct::for_each_cast(fn);
  using r = gc::int8_rounding;
  fn("int8", gc::int8_codec{}, gc::cuda::int8_codec{});
  fn("int8:bucket=100,rounding=stochastic", gc::int8_codec{100, r::stochastic},
     gc::cuda::int8_codec{100, r::stochastic});
  gct::for_each_onebit(fn);
  fn("natural:bucket=100", gc::natural_codec{100}, gc::cuda::natural_codec{100});
  fn("qsgd", gc::qsgd_codec{}, gc::cuda::qsgd_codec{});
  fn("terngrad", gc::terngrad_codec{}, gc::cuda::terngrad_codec{});
  fn("dithering:levels=5,norm=l2,bucket=16",
     gc::dithering_codec{5, gc::dither_partition::linear, gc::dither_norm::l2, 16},
     gc::cuda::dithering_codec{5, gc::dither_partition::linear, gc::dither_norm::l2, 16});
}

// The sparsifiers through the collectives: gathered (top-k, approximate top-k, threshold) and
// shared support (random-k, scaled random-k: the values all-reduced at coordinates every rank
// draws from the shared seed and step).
template <class Fn>
void for_each_collective_sparsifier(Fn&& fn) {
  using v = gc::sparse_values;
  fn("topk:ratio=0.1", gc::topk_codec::ratio(0.1), gc::cuda::topk_codec::ratio(0.1));
  fn("topk:k=37,values=f16", gc::topk_codec::count(37, v::f16), gc::cuda::topk_codec::count(37, v::f16));
  fn("approx_topk:ratio=0.05", gc::approx_topk_codec::ratio(0.05), gc::cuda::approx_topk_codec::ratio(0.05));
  fn("threshold:1,values=bf16", gc::threshold_codec{1.0f, v::bf16}, gc::cuda::threshold_codec{1.0f, v::bf16});
  fn("random_k:ratio=0.2", gc::random_k_codec::ratio(0.2), gc::cuda::random_k_codec::ratio(0.2));
  fn("scaled_random_k:k=300,values=bf16", gc::scaled_random_k_codec::count(300, v::bf16),
     gc::cuda::scaled_random_k_codec::count(300, v::bf16));
}

// Every codec the collective cases run.
template <class Fn>
void for_each_collective_source(Fn&& fn) {
  for_each_collective_codec(fn);
  for_each_collective_sparsifier(fn);
}

// Payload bytes every rank sends at least: whole packets (gathered), n 16- or 32-bit values
// (summable), or the selected values (shared support).
template <class CpuCodec, class CudaCodec>
std::size_t least_payload(CudaCodec const& dev, std::size_t n) {
  if constexpr (CpuCodec::aggregation == gc::aggregation_kind::gather) {
    return gc::header_bytes;
  } else if constexpr (CpuCodec::aggregation == gc::aggregation_kind::shared_support) {
    return 2 * dev.k_for(n);
  } else {
    return 2 * n;
  }
}

// Control messages of one collective call: the agreement round (32 bytes per rank) and the
// outcome round (12 bytes); nothing larger goes through the host.
constexpr std::size_t control_bound = 64;

}  // namespace

TEST_CASE("cuda collective: stream_codec is a codec with the CPU codec's traits",
          "[cuda][collective]") {
  gct::for_each_cast([](char const*, auto cpu, auto dev) {
    using S = gc::cuda::stream_codec<decltype(dev)>;
    static_assert(gc::codec<S>);
    static_assert(S::id == decltype(cpu)::id && S::aggregation == decltype(cpu)::aggregation &&
                  S::unbiased == decltype(cpu)::unbiased);
    CHECK(S(dev).bits_per_element() == cpu.bits_per_element());
  });
  auto same_traits = [](char const* name, auto cpu, auto dev) {
    INFO(name);
    using S = gc::cuda::stream_codec<decltype(dev)>;
    static_assert(gc::codec<S>);
    static_assert(gc::detail::packet_source<S>);
    static_assert(S::id == decltype(cpu)::id && S::aggregation == decltype(cpu)::aggregation &&
                  S::unbiased == decltype(cpu)::unbiased);
    S const s(dev);
    CHECK(s.bits_per_element() == cpu.bits_per_element());
    CHECK(s.max_compressed_bytes(1000) == cpu.max_compressed_bytes(1000));
  };
  gct::for_each_quantizer(same_traits);
  for_each_collective_sparsifier(same_traits);
  static_assert(gc::memory_space<gc::cuda::device_memory>);
  static_assert(!gc::detail::host_payloads<gc::cuda::stream_codec<gc::cuda::int8_codec>>);
  static_assert(!gc::detail::host_payloads<gc::cuda::device_compressor<gc::cuda::int8_codec>>);
  static_assert(gc::detail::host_payloads<gc::int8_codec>);
}

TEST_CASE("cuda collective: the emulated device memory is told from host memory",
          "[cuda][collective]") {
  gc::cuda::device_buffer b;
  b.resize(100);
  std::vector<std::byte> h(100);
  CHECK(memory_kind_of(b.data()) == memory_kind::device);
  CHECK(memory_kind_of(b.data() + 99) == memory_kind::device);
  CHECK(memory_kind_of(h.data()) == memory_kind::host);
  void const* const old = b.data();
  b.resize(1000);  // grows: the old block is released
  CHECK(memory_kind_of(b.data() + 999) == memory_kind::device);
  if (old != b.data()) CHECK(memory_kind_of(old) == memory_kind::host);
}

TEST_CASE("cuda collective: all_reduce_compressed on device memory equals the CPU collective",
          "[cuda][collective]") {
  for_each_collective_source([](char const* name, auto cpu, auto dev) {
    for (int w : {2, 3, 4}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{4099}}) {
        for (gc::reduction op : {gc::reduction::sum, gc::reduction::average}) {
          INFO(name << ", " << w << " ranks, n = " << n << ", "
                    << (op == gc::reduction::sum ? "sum" : "average"));
          std::vector<bool> const all(static_cast<std::size_t>(w), true);
          traffic log;
          auto const want = run_cpu(cpu, w, n, op, all);
          auto const got = run_device(dev, w, n, op, all, log);
          expect_same(want, got);
          // Payloads on the device, control messages small and on the host, never mixed.
          CHECK(log.device_ops == static_cast<std::size_t>(w));
          CHECK(log.device_bytes >= static_cast<std::size_t>(w) * least_payload<decltype(cpu)>(dev, n));
          CHECK(log.host_ops == 2 * static_cast<std::size_t>(w));
          CHECK(log.host_max <= control_bound);
          CHECK(log.mixed == 0);
        }
      }
    }
  });
}

TEST_CASE("cuda collective: a rank without a gradient, on device memory, as on the CPU",
          "[cuda][collective]") {
  for_each_collective_source([](char const* name, auto cpu, auto dev) {
    for (int w : {2, 4}) {
      INFO(name << ", " << w << " ranks");
      std::vector<bool> some(static_cast<std::size_t>(w), true);
      some[1] = false;
      traffic log;
      expect_same(run_cpu(cpu, w, 513, gc::reduction::average, some),
                  run_device(dev, w, 513, gc::reduction::average, some, log));
      CHECK(log.mixed == 0);
    }
  });
}

namespace {

// The codecs the error-feedback cases run (every family, gathered and shared support).
template <class Fn>
void for_each_feedback_codec(Fn&& fn) {
  fn("fp16", gc::fp16_codec{}, gc::cuda::fp16_codec{});
  fn("int8:rounding=stochastic", gc::int8_codec{512, gc::int8_rounding::stochastic},
     gc::cuda::int8_codec{512, gc::int8_rounding::stochastic});
  fn("onebit", gc::onebit_codec{}, gc::cuda::onebit_codec{});
  fn("qsgd", gc::qsgd_codec{}, gc::cuda::qsgd_codec{});
  fn("natural", gc::natural_codec{}, gc::cuda::natural_codec{});
  fn("topk:ratio=0.05", gc::topk_codec::ratio(0.05), gc::cuda::topk_codec::ratio(0.05));
  fn("topk:k=37,values=f16", gc::topk_codec::count(37, gc::sparse_values::f16),
     gc::cuda::topk_codec::count(37, gc::sparse_values::f16));
  fn("threshold:1.5", gc::threshold_codec{1.5f}, gc::cuda::threshold_codec{1.5f});
  fn("random_k:ratio=0.1", gc::random_k_codec::ratio(0.1), gc::cuda::random_k_codec::ratio(0.1));
  fn("scaled_random_k:k=99,values=f16", gc::scaled_random_k_codec::count(99, gc::sparse_values::f16),
     gc::cuda::scaled_random_k_codec::count(99, gc::sparse_values::f16));
}

}  // namespace

TEST_CASE(
    "cuda collective: device error feedback through all_reduce_compressed equals "
    "compressor<residual_feedback>",
    "[cuda][collective][feedback]") {
  auto check = [](char const* name, auto cpu_codec, auto dev_codec) {
    using cpu_type = gc::compressor<decltype(cpu_codec), gc::residual_feedback>;
    using dev_type = gc::cuda::device_compressor<decltype(dev_codec)>;
    for (int w : {2, 3, 4}) {
      INFO(name << ", " << w << " ranks");
      std::size_t const n = 2053;
      std::vector<cpu_type> cpus(static_cast<std::size_t>(w), cpu_type(cpu_codec));
      std::vector<dev_type> devs;
      for (int r = 0; r < w; ++r)
        devs.emplace_back(gc::cuda::stream_codec<decltype(dev_codec)>(dev_codec));
      for (std::uint32_t step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> want(static_cast<std::size_t>(w)), got(want.size()),
            res_cpu(want.size()), res_dev(want.size());
        gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
          int const r = comm.rank();
          std::vector<float> const g = gradient(n, r, step);
          std::vector<float> out(n);
          gc::all_reduce_compressed(
              comm, cpus[static_cast<std::size_t>(r)],
              gc::tensor_view<float const>(std::span<float const>(g), gc::tensor_id{9}),
              std::span<float>(out), context_for<decltype(cpu_codec)>(r, step), {.op = gc::reduction::average});
          auto const e = cpus[static_cast<std::size_t>(r)].state(gc::tensor_id{9}).values();
          res_cpu[static_cast<std::size_t>(r)].assign(e.begin(), e.end());
          want[static_cast<std::size_t>(r)] = std::move(out);
        });
        traffic log;
        gc::run_in_process(w, [&](gc::in_process_communicator& inner) {
          emulated_nccl comm(inner, log);
          int const r = comm.rank();
          gc::cuda::device_buffer g = to_device(gradient(n, r, step));
          gc::cuda::device_buffer out = to_device(std::vector<float>(n));
          gc::all_reduce_compressed(
              comm, devs[static_cast<std::size_t>(r)],
              gc::tensor_view<float const>(std::span<float const>(floats(g, n)), gc::tensor_id{9}),
              floats(out, n), context_for<gc::cuda::stream_codec<decltype(dev_codec)>>(r, step), {.op = gc::reduction::average});
          got[static_cast<std::size_t>(r)] = to_host(out, n);
          auto const e = devs[static_cast<std::size_t>(r)].residual(gc::tensor_id{9});
          RANK_REQUIRE(e.size() == n && memory_kind_of(e.data()) == memory_kind::device);
          res_dev[static_cast<std::size_t>(r)].assign(e.begin(), e.end());
        });
        for (std::size_t r = 0; r < want.size(); ++r) {
          INFO("step " << step << ", rank " << r);
          CHECK(same_bits(want[r], got[r]));
          CHECK(same_bits(res_cpu[r], res_dev[r]));
        }
        CHECK(log.mixed == 0);
        CHECK(log.host_max <= control_bound);
      }
    }
  };
  for_each_feedback_codec(check);
}

namespace {

// The CPU policies and their device rules compared: EF21, DGC (momentum 0.9, no clipping) and
// DGC with clipping to 0.5 over w workers (every gradient here is clipped).
template <class Fn>
void for_each_rule(int w, Fn&& fn) {
  fn("ef21", gc::ef21_feedback{}, gc::cuda::device_ef21_rule{});
  fn("dgc:momentum=0.9", gc::dgc_feedback(0.9f), gc::cuda::device_dgc_rule(0.9f));
  fn("dgc:momentum=0.5,clip=0.5", gc::dgc_feedback(0.5f, 0.5, static_cast<std::uint32_t>(w)),
     gc::cuda::device_dgc_rule(0.5f, 0.5, static_cast<std::uint32_t>(w)));
}

// The committed state of a tensor: `compressor`'s policy state or the device state.
template <class Src>
std::vector<float> state_of(Src& src, gc::tensor_id id) {
  if constexpr (requires { { src.state(id) } -> std::convertible_to<std::span<float const>>; }) {
    auto const e = src.state(id);  // cuda::device_compressor: device memory
    if (!e.empty() && memory_kind_of(e.data()) != memory_kind::device) throw std::logic_error("state on the host");
    return {e.begin(), e.end()};
  } else {
    auto const e = src.state(id).values();
    return {e.begin(), e.end()};
  }
}

// One rank's all_reduce_compressed of `g` (n_out outputs) through `src`, on host or emulated
// device memory: its output.
template <class Comm, class Src>
std::vector<float> reduce_once(Comm& comm, Src& src, std::vector<float> const& g, std::size_t n_out,
                               gc::tensor_id id, gc::codec_context const& ctx, gc::reduction op) {
  if constexpr (gc::detail::host_payloads<Src>) {
    std::vector<float> out(n_out, -7.0f);
    gc::all_reduce_compressed(comm, src, gc::tensor_view<float const>(std::span<float const>(g), id),
                              std::span<float>(out), ctx, {.op = op});
    return out;
  } else {
    gc::cuda::device_buffer dg = to_device(g);
    gc::cuda::device_buffer out = to_device(std::vector<float>(n_out, -7.0f));
    gc::all_reduce_compressed(comm, src, gc::tensor_view<float const>(std::span<float const>(floats(dg, g.size())), id),
                              floats(out, n_out), ctx, {.op = op});
    return to_host(out, n_out);
  }
}

}  // namespace

TEST_CASE(
    "cuda collective: device EF21 and DGC through all_reduce_compressed equal compressor<ef21_feedback> and "
    "compressor<dgc_feedback>",
    "[cuda][collective][feedback]") {
  auto check = [](char const* codec_name, auto cpu_codec, auto dev_codec) {
    using scodec = gc::cuda::stream_codec<decltype(dev_codec)>;
    for (int w : {2, 3, 4}) {
      for_each_rule(w, [&](char const* rule_name, auto cpu_rule, auto dev_rule) {
        using cpu_type = gc::compressor<decltype(cpu_codec), decltype(cpu_rule)>;
        using dev_type = gc::cuda::device_compressor<decltype(dev_codec), decltype(dev_rule)>;
        static_assert(cpu_type::receives == dev_type::receives);
        static_assert(gc::detail::packet_source<dev_type> && gc::detail::two_phase_source<dev_type>);
        for (std::size_t n : {std::size_t{2053}, std::size_t{101}}) {
          gc::reduction const op = w == 3 ? gc::reduction::sum : gc::reduction::average;
          INFO(codec_name << ", " << rule_name << ", " << w << " ranks, n = " << n);
          std::deque<cpu_type> cpus;
          std::deque<dev_type> devs;
          for (int r = 0; r < w; ++r) {
            cpus.emplace_back(cpu_codec, cpu_rule);
            devs.emplace_back(scodec(dev_codec), dev_rule);
          }
          gc::tensor_id const id{9};
          for (std::uint32_t step = 0; step < 4; ++step) {
            auto const uw = static_cast<std::size_t>(w);
            std::vector<std::vector<float>> want(uw), got(uw), st_cpu(uw), st_dev(uw), recv(uw);
            REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
              auto const r = static_cast<std::size_t>(comm.rank());
              want[r] = reduce_once(comm, cpus[r], gradient(n, comm.rank(), step), n, id,
                                    context_for<decltype(cpu_codec)>(comm.rank(), step), op);
              st_cpu[r] = state_of(cpus[r], id);
            }));
            traffic log;
            REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& inner) {
              emulated_nccl comm(inner, log);
              auto const r = static_cast<std::size_t>(comm.rank());
              got[r] = reduce_once(comm, devs[r], gradient(n, comm.rank(), step), n, id,
                                   context_for<scodec>(comm.rank(), step), op);
              st_dev[r] = state_of(devs[r], id);
              if constexpr (dev_type::receives) {
                auto const h = devs[r].receiver(id);
                RANK_REQUIRE(memory_kind_of(h.data()) == memory_kind::device);
                recv[r].assign(h.begin(), h.end());
              }
            }));
            for (std::size_t r = 0; r < uw; ++r) {
              INFO("step " << step << ", rank " << r);
              CHECK(same_bits(want[r], got[r]));
              CHECK(same_bits(st_cpu[r], st_dev[r]));
              CHECK(st_dev[r].size() == decltype(dev_rule)::state_floats(n));
              // EF21: the output is the receiver's estimate, on every rank the same.
              if constexpr (dev_type::receives) {
                CHECK(same_bits(recv[r], got[r]));
                CHECK(same_bits(got[r], got[0]));
              }
            }
            CHECK(log.mixed == 0);
            CHECK(log.host_max <= control_bound);
          }
        }
      });
    }
  };
  for_each_feedback_codec(check);
}

TEST_CASE("cuda collective: a failed EF21 or DGC step changes no state on either backend",
          "[cuda][collective][feedback][failure]") {
  auto check = [](char const* codec_name, auto cpu_codec, auto dev_codec) {
    using scodec = gc::cuda::stream_codec<decltype(dev_codec)>;
    for (int w : {2, 3, 4}) {
      for_each_rule(w, [&](char const* rule_name, auto cpu_rule, auto dev_rule) {
        using cpu_type = gc::compressor<decltype(cpu_codec), decltype(cpu_rule)>;
        using dev_type = gc::cuda::device_compressor<decltype(dev_codec), decltype(dev_rule)>;
        INFO(codec_name << ", " << rule_name << ", " << w << " ranks");
        std::size_t const n = 777;
        auto const uw = static_cast<std::size_t>(w);
        gc::tensor_id const id{2};
        std::deque<cpu_type> cpus;
        std::deque<dev_type> devs;
        for (int r = 0; r < w; ++r) {
          cpus.emplace_back(cpu_codec, cpu_rule);
          devs.emplace_back(scodec(dev_codec), dev_rule);
        }
        // Step `step` of every rank on both backends, rank 1's gradient (and output) edited by
        // `edit`; returns the outputs, or what each rank threw.
        auto run = [&](std::uint32_t step, auto edit, std::vector<std::vector<float>>* outs) {
          std::vector<std::vector<float>> o_cpu(uw), o_dev(uw);
          auto grad = [&](int r) {
            std::vector<float> g = gradient(n, r, step);
            if (r == 1) edit(g);
            return g;
          };
          auto const c = run_failing<false>(w, [&](auto& comm, int r) {
            std::vector<float> const g = grad(r);
            o_cpu[static_cast<std::size_t>(r)] =
                reduce_once(comm, cpus[static_cast<std::size_t>(r)], g, g.size(), id,
                            context_for<decltype(cpu_codec)>(r, step), gc::reduction::average);
          });
          auto const d = run_failing<true>(w, [&](auto& comm, int r) {
            std::vector<float> const g = grad(r);
            o_dev[static_cast<std::size_t>(r)] =
                reduce_once(comm, devs[static_cast<std::size_t>(r)], g, g.size(), id,
                            context_for<scodec>(r, step), gc::reduction::average);
          });
          CHECK(d == c);
          if (outs != nullptr) {
            for (std::size_t r = 0; r < uw; ++r) CHECK(same_bits(o_cpu[r], o_dev[r]));
            *outs = o_dev;
          }
          return c;
        };
        auto states = [&] {
          std::vector<std::vector<float>> v;
          for (auto& c : cpus) v.push_back(state_of(c, id));
          for (auto& d : devs) v.push_back(state_of(d, id));
          return v;
        };
        auto keep = [](std::vector<float>&) {};
        std::vector<std::vector<float>> outs;
        for (std::uint32_t step = 0; step < 2; ++step) {
          for (thrown t : run(step, keep, &outs)) CHECK(t == thrown::nothing);
        }
        auto const before = states();
        for (std::size_t r = 0; r < uw; ++r) CHECK(same_bits(before[r], before[uw + r]));
        // Rank 1's gradient (and output) of another size than its state: its config_error,
        // after the other ranks staged their steps.
        auto const sized = run(2, [](std::vector<float>& g) { g.resize(g.size() - 5); }, nullptr);
        CHECK(sized[1] == thrown::config);
        for (std::size_t r = 0; r < uw; ++r) {
          if (r != 1) CHECK(sized[r] != thrown::nothing);
        }
        // A NaN on rank 1: its numeric_error, comm_error elsewhere.
        auto const nan = run(2, [](std::vector<float>& g) { g[5] = std::nanf(""); }, nullptr);
        for (std::size_t r = 0; r < uw; ++r) CHECK(nan[r] == (r == 1 ? thrown::numeric : thrown::comm));
        auto const after = states();
        for (std::size_t i = 0; i < after.size(); ++i) CHECK(same_bits(before[i], after[i]));
        // Then both backends take the next step alike (EF21: the receivers were kept too).
        for (thrown t : run(2, keep, &outs)) CHECK(t == thrown::nothing);
        auto const next = states();
        for (std::size_t r = 0; r < uw; ++r) {
          CHECK(same_bits(next[r], next[uw + r]));
          CHECK(!same_bits(next[r], before[r]));
        }
      });
    }
  };
  check("int8", gc::int8_codec{}, gc::cuda::int8_codec{});
  check("topk:ratio=0.05", gc::topk_codec::ratio(0.05), gc::cuda::topk_codec::ratio(0.05));
}

// One compression of `g` (tensor `id`) by a CPU compressor and a device compressor: the packets
// byte for byte alike; returns the CPU's.
template <class Cpu, class Dev>
std::vector<std::byte> compress_alike(Cpu& cpu, Dev& dev, std::vector<float> const& g, gc::tensor_id id,
                                      gc::codec_context const& ctx) {
  std::size_t const bound = cpu.max_compressed_bytes(g.size());
  std::vector<std::byte> pc(bound);
  std::size_t const bc = cpu.compress(gc::tensor_view<float const>(std::span<float const>(g), id), pc, ctx);
  pc.resize(bc);
  gc::cuda::device_buffer dg = to_device(g), pd;
  pd.resize(bound);
  std::size_t const bd =
      dev.compress(gc::tensor_view<float const>(std::span<float const>(floats(dg, g.size())), id), pd.span(), ctx);
  REQUIRE(bc == bd);
  std::vector<std::byte> host(bd);
  std::memcpy(host.data(), pd.data(), bd);
  CHECK(host == pc);
  return pc;
}

TEST_CASE("cuda collective: device commit_lossless, stage_input and the two phases equal compressor's",
          "[cuda][collective][feedback]") {
  // One rank, no collective: the compressors' own operations, step after step.
  auto check = [](char const* name, auto cpu_codec, auto dev_codec, auto cpu_rule, auto dev_rule) {
    INFO(name);
    using cpu_type = gc::compressor<decltype(cpu_codec), decltype(cpu_rule)>;
    using dev_type = gc::cuda::device_compressor<decltype(dev_codec), decltype(dev_rule)>;
    cpu_type cpu(cpu_codec, cpu_rule);
    dev_type dev(gc::cuda::stream_codec<decltype(dev_codec)>(dev_codec), dev_rule);
    gc::tensor_id const id{3};
    std::size_t const n = 1031;
    std::size_t const bound = cpu.max_compressed_bytes(n);
    REQUIRE(dev.codec().max_compressed_bytes(n) == bound);
    auto same_state = [&] { return same_bits(state_of(cpu, id), state_of(dev, id)); };
    // A compressed step through the two phases: the packets and the states alike.
    auto packet_step = [&](std::uint32_t step) {
      (void)compress_alike(cpu, dev, gradient(n, 0, step), id, rank_context(0, step));
      CHECK(same_state());
    };
    // A dense step: the staged input sent as it is.
    auto dense_step = [&](std::uint32_t step) {
      std::vector<float> const g = gradient(n, 0, step);
      gc::codec_context const ctx = rank_context(0, step);
      auto const pc = cpu.stage_input(gc::tensor_view<float const>(std::span<float const>(g), id), ctx);
      gc::cuda::device_buffer dg = to_device(g);
      auto const pd = dev.stage_input(gc::tensor_view<float const>(std::span<float const>(floats(dg, n)), id), ctx);
      CHECK(memory_kind_of(pd.data()) == memory_kind::device);
      CHECK(same_bits(std::vector<float>(pc.begin(), pc.end()), std::vector<float>(pd.begin(), pd.end())));
      CHECK(same_bits(to_host(dev.staged_input(id)), std::vector<float>(pd.begin(), pd.end())));
      cpu.commit_lossless(id);
      dev.commit_lossless(id);
      CHECK(same_state());
      CHECK(dev.staged_input(id).empty());
    };
    dense_step(0);  // from a zero state
    packet_step(1);
    packet_step(2);
    dense_step(3);  // from a state
    packet_step(4);
    // A stage that is discarded leaves the state; a commit without a stage is a config_error.
    std::vector<float> const before = state_of(dev, id);
    {
      gc::cuda::device_buffer dg = to_device(gradient(n, 0, 5)), pd;
      pd.resize(bound);
      dev.stage(gc::tensor_view<float const>(std::span<float const>(floats(dg, n)), id), pd.span(), rank_context(0, 5));
      dev.discard(id);
    }
    CHECK(same_bits(before, state_of(dev, id)));
    CHECK_THROWS_AS(dev.commit_lossless(id), gc::config_error);
    CHECK_THROWS_AS(dev.apply_commit(id), gc::config_error);
    // A gradient of another size: config_error, state unchanged.
    {
      gc::cuda::device_buffer dg = to_device(gradient(n - 1, 0, 6)), pd;
      pd.resize(bound);
      CHECK_THROWS_AS(dev.stage(gc::tensor_view<float const>(std::span<float const>(floats(dg, n - 1)), id),
                                pd.span(), rank_context(0, 6)),
                      gc::config_error);
    }
    CHECK(same_bits(before, state_of(dev, id)));
    packet_step(7);
    dev.reset();
    CHECK(dev.state(id).empty());
  };
  auto rules = [&](char const* name, auto cpu_codec, auto dev_codec) {
    check(name, cpu_codec, dev_codec, gc::residual_feedback{}, gc::cuda::device_residual_rule{});
    check(name, cpu_codec, dev_codec, gc::ef21_feedback{}, gc::cuda::device_ef21_rule{});
    check(name, cpu_codec, dev_codec, gc::dgc_feedback(0.9f), gc::cuda::device_dgc_rule(0.9f));
    check(name, cpu_codec, dev_codec, gc::dgc_feedback(0.9f, 2.0, 3), gc::cuda::device_dgc_rule(0.9f, 2.0, 3));
  };
  rules("int8", gc::int8_codec{}, gc::cuda::int8_codec{});
  rules("onebit", gc::onebit_codec{}, gc::cuda::onebit_codec{});
  rules("topk:ratio=0.05", gc::topk_codec::ratio(0.05), gc::cuda::topk_codec::ratio(0.05));
  rules("random_k:ratio=0.1", gc::random_k_codec::ratio(0.1), gc::cuda::random_k_codec::ratio(0.1));
  // The device rule checks dgc_feedback's parameters.
  CHECK_THROWS_AS(gc::cuda::device_dgc_rule(1.0f), gc::config_error);
  CHECK_THROWS_AS(gc::cuda::device_dgc_rule(0.5f, -1.0), gc::config_error);
  CHECK_THROWS_AS(gc::cuda::device_dgc_rule(0.5f, 1.0, 0), gc::config_error);
}

TEST_CASE("cuda collective: device DGC zeroes the momentum on a sparse packet's whole support",
          "[cuda][collective][feedback]") {
  // A sparse packet whose f16 values include ones that round to zero still carries those
  // coordinates: DGC's u becomes zero there too (the support is found on the device, not from
  // the decoded values). Mutation check: masking where the decoded value is non-zero instead
  // fails the state comparison below.
  auto check = [](char const* name, auto cpu_codec, auto dev_codec) {
    INFO(name);
    gc::compressor<decltype(cpu_codec), gc::dgc_feedback> cpu(cpu_codec, gc::dgc_feedback(0.9f));
    gc::cuda::device_compressor<decltype(dev_codec), gc::cuda::device_dgc_rule> dev(
        gc::cuda::stream_codec<decltype(dev_codec)>(dev_codec), gc::cuda::device_dgc_rule(0.9f));
    gc::tensor_id const id{5};
    std::size_t const n = 600;
    std::size_t zero_valued = 0;
    for (std::uint32_t step = 0; step < 3; ++step) {
      // Every third element of order one, the others below f16's smallest subnormal (2^-24).
      std::vector<float> g = gradient(n, 0, step);
      for (std::size_t i = 0; i < n; ++i) {
        if (i % 3 != 0) g[i] *= 1e-9f;
      }
      gc::codec_context const ctx = rank_context(0, step);
      std::vector<std::byte> const pc = compress_alike(cpu, dev, g, id, ctx);
      // The support holds coordinates whose values decoded to zero.
      std::vector<float> decoded(n, 0.0f);
      cpu.codec().decompress(std::span<std::byte const>(pc), std::span<float>(decoded), ctx);
      auto const support = gc::sparse_packet_support(std::span<std::byte const>(pc), ctx);
      REQUIRE(support);
      for (std::uint32_t i : *support) zero_valued += decoded[i] == 0.0f ? 1 : 0;
      CHECK(same_bits(state_of(cpu, id), state_of(dev, id)));
    }
    CHECK(zero_valued > 0);
  };
  check("topk:ratio=0.5,values=f16", gc::topk_codec::ratio(0.5, gc::sparse_values::f16),
        gc::cuda::topk_codec::ratio(0.5, gc::sparse_values::f16));
  check("random_k:ratio=0.5,values=f16", gc::random_k_codec::ratio(0.5, gc::sparse_values::f16),
        gc::cuda::random_k_codec::ratio(0.5, gc::sparse_values::f16));
}

TEST_CASE("cuda collective: a failing rank fails the device step on every rank, residuals kept",
          "[cuda][collective][failure]") {
  for (int w : {2, 3, 4}) {
    INFO(w << " ranks");
    std::size_t const n = 777;
    using dev_type = gc::cuda::device_compressor<gc::cuda::int8_codec>;
    std::vector<dev_type> devs;
    for (int r = 0; r < w; ++r) devs.emplace_back(gc::cuda::stream_codec<gc::cuda::int8_codec>{});
    auto step = [&](emulated_nccl& comm, int r, std::vector<float> const& hg) {
      gc::cuda::device_buffer g = to_device(hg);
      gc::cuda::device_buffer out = to_device(std::vector<float>(n));
      gc::all_reduce_compressed(
          comm, devs[static_cast<std::size_t>(r)],
          gc::tensor_view<float const>(std::span<float const>(floats(g, n)), gc::tensor_id{2}),
          floats(out, n), rank_context(r, 0));
    };
    // A first step that succeeds everywhere.
    auto const ok =
        run_failing<true>(w, [&](emulated_nccl& comm, int r) { step(comm, r, gradient(n, r, 0)); });
    for (thrown t : ok) CHECK(t == thrown::nothing);
    std::vector<std::vector<float>> before;
    for (auto& d : devs) {
      auto const e = d.residual(gc::tensor_id{2});
      before.emplace_back(e.begin(), e.end());
    }
    // Rank 1's gradient holds a NaN: its own numeric_error there, comm_error everywhere else.
    auto const nan = run_failing<true>(w, [&](emulated_nccl& comm, int r) {
      std::vector<float> g = gradient(n, r, 1);
      if (r == 1) g[5] = std::nanf("");
      step(comm, r, g);
    });
    for (int r = 0; r < w; ++r)
      CHECK(nan[static_cast<std::size_t>(r)] == (r == 1 ? thrown::numeric : thrown::comm));
    // The last rank disappears before the collective: every other rank fails with comm_error.
    auto const gone = run_failing<true>(w, [&](emulated_nccl& comm, int r) {
      if (r == w - 1) throw std::runtime_error("rank lost");
      step(comm, r, gradient(n, r, 1));
    });
    for (int r = 0; r + 1 < w; ++r) CHECK(gone[static_cast<std::size_t>(r)] == thrown::comm);
    CHECK(gone[static_cast<std::size_t>(w - 1)] == thrown::other);
    // Neither failed step changed a residual.
    for (int r = 0; r < w; ++r) {
      auto const e = devs[static_cast<std::size_t>(r)].residual(gc::tensor_id{2});
      CHECK(same_bits(before[static_cast<std::size_t>(r)], std::vector<float>(e.begin(), e.end())));
    }
  }
}

TEST_CASE("cuda collective: options a device source does not take are errors on every rank",
          "[cuda][collective][failure]") {
  auto const got = run_failing<true>(3, [&](emulated_nccl& comm, int r) {
    gc::cuda::stream_codec<gc::cuda::int8_codec> const dc;
    gc::cuda::device_buffer g = to_device(gradient(64, r, 0));
    gc::cuda::device_buffer out = to_device(std::vector<float>(64));
    gc::all_reduce_compressed(comm, dc,
                              gc::tensor_view<float const>(std::span<float const>(floats(g, 64))),
                              floats(out, 64), {}, {.checksum = true});
  });
  for (thrown t : got) CHECK(t == thrown::config);
  // An output buffer too small for the packet is the codec's config_error.
  gc::cuda::stream_codec<gc::cuda::fp16_codec> const dc;
  gc::cuda::device_buffer g = to_device(gradient(64, 0, 0));
  gc::cuda::device_buffer small;
  small.resize(10);
  CHECK_THROWS_AS(dc.compress(gc::tensor_view<float const>(std::span<float const>(floats(g, 64))),
                              small.span()),
                  gc::config_error);
}

namespace {

// One rank's outcome of a low-rank step: its output and its residual afterwards.
struct low_rank_outcome {
  std::vector<float> out, residual;
  gc::collective_result res;
};

std::vector<float> device_residual(gc::cuda::powersgd_session const& s) {
  gc::cuda::device_buffer e;
  e.resize(4 * s.state().size());
  s.state().residual(reinterpret_cast<float*>(e.data()));
  return to_host(e, s.state().size());
}

}  // namespace

TEST_CASE(
    "cuda collective: cuda::powersgd_session through all_reduce_low_rank equals the CPU session",
    "[cuda][collective][powersgd]") {
  struct shape {
    std::size_t rows, cols;
    std::uint32_t rank;
    std::uint64_t min_elements;
  };
  // low rank (48 x 33, rank 3), a column (rank 2 of 40 x 1: dense by the ratio rule) and a small
  // matrix sent dense (below min_elements)
  for (shape const sh : {shape{48, 33, 3, 0}, shape{40, 1, 2, 0}, shape{5, 4, 4, 4096}}) {
    std::size_t const n = sh.rows * sh.cols;
    gc::powersgd_options co;
    co.rank = sh.rank;
    co.min_elements = sh.min_elements;
    co.backend = gc::cpu::gemm_backend::builtin;
    gc::cuda::powersgd_options go;
    go.rank = sh.rank;
    go.min_elements = sh.min_elements;
    gc::tensor_id const id{6};
    for (int w : {2, 3, 4}) {
      INFO(sh.rows << " x " << sh.cols << ", rank " << sh.rank << ", " << w << " ranks");
      std::deque<gc::powersgd_session> cpus;
      std::deque<gc::cuda::powersgd_session> devs;
      for (int r = 0; r < w; ++r) {
        cpus.emplace_back(sh.rows, sh.cols, co, id);
        devs.emplace_back(sh.rows, sh.cols, go, id);
      }
      CHECK(devs[0].shape_fingerprint(n) == cpus[0].shape_fingerprint(n));
      CHECK(devs[0].state().mode() == cpus[0].state().mode());
      for (std::uint32_t step = 0; step < 3; ++step) {
        // rank 1 sits out step 1 (its factors are zero, its residual still flows)
        auto contributes = [&](int r) { return !(step == 1 && r == 1); };
        std::vector<low_rank_outcome> want(static_cast<std::size_t>(w)), got(want.size());
        gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
          int const r = comm.rank();
          std::vector<float> const g = contributes(r) ? gradient(n, r, step) : std::vector<float>{};
          std::vector<float> out(n, -7.0f);
          auto& s = cpus[static_cast<std::size_t>(r)];
          auto res = gc::all_reduce_low_rank(comm, s, gc::tensor_view<float const>(std::span<float const>(g), id),
                                             std::span<float>(out), rank_context(0, step),
                                             {.op = gc::reduction::average});
          want[static_cast<std::size_t>(r)] = {std::move(out), s.state().residual(), res};
        });
        traffic log;
        gc::run_in_process(w, [&](gc::in_process_communicator& inner) {
          emulated_nccl comm(inner, log);
          int const r = comm.rank();
          std::vector<float> const hg = contributes(r) ? gradient(n, r, step) : std::vector<float>{};
          gc::cuda::device_buffer g = to_device(hg);
          gc::cuda::device_buffer out = to_device(std::vector<float>(n, -7.0f));
          auto& s = devs[static_cast<std::size_t>(r)];
          auto res = gc::all_reduce_low_rank(
              comm, s, gc::tensor_view<float const>(std::span<float const>(floats(g, hg.size())), id),
              floats(out, n), rank_context(0, step), {.op = gc::reduction::average});
          got[static_cast<std::size_t>(r)] = {to_host(out, n), device_residual(s), res};
        });
        for (std::size_t r = 0; r < want.size(); ++r) {
          INFO("step " << step << ", rank " << r);
          CHECK(same_bits(want[r].out, got[r].out));
          CHECK(same_bits(want[r].residual, got[r].residual));
          CHECK(want[r].res.path == got[r].res.path);
          CHECK(want[r].res.packet_bytes == got[r].res.packet_bytes);
          CHECK(want[r].res.wire_bytes == got[r].res.wire_bytes);
        }
        // The factors go on the device (one all-reduce each), the control rounds on the host.
        CHECK(log.device_ops == static_cast<std::size_t>(w) * cpus[0].factor_count());
        CHECK(log.host_max <= control_bound);
        CHECK(log.mixed == 0);
      }
      // A NaN on rank 1: its numeric_error there, comm_error on the others, on both backends;
      // every residual as before, and the next step alike again.
      std::vector<std::vector<float>> before_cpu, before_dev;
      for (auto const& s : cpus) before_cpu.push_back(s.state().residual());
      for (auto const& s : devs) before_dev.push_back(device_residual(s));
      auto nan_step = [&](auto& comm, int r, auto& s, auto&& to_view) {
        std::vector<float> g = gradient(n, r, 3);
        if (r == 1) g[n / 2] = std::nanf("");
        to_view(comm, s, g);
      };
      auto const c = run_failing<false>(w, [&](auto& comm, int r) {
        nan_step(comm, r, cpus[static_cast<std::size_t>(r)], [&](auto& cm, auto& s, std::vector<float> const& g) {
          std::vector<float> out(n);
          gc::all_reduce_low_rank(cm, s, gc::tensor_view<float const>(std::span<float const>(g), id),
                                  std::span<float>(out), rank_context(0, 3));
        });
      });
      auto const d = run_failing<true>(w, [&](auto& comm, int r) {
        nan_step(comm, r, devs[static_cast<std::size_t>(r)], [&](auto& cm, auto& s, std::vector<float> const& g) {
          gc::cuda::device_buffer dg = to_device(g);
          gc::cuda::device_buffer out = to_device(std::vector<float>(n));
          gc::all_reduce_low_rank(cm, s, gc::tensor_view<float const>(std::span<float const>(floats(dg, n)), id),
                                  floats(out, n), rank_context(0, 3));
        });
      });
      for (int r = 0; r < w; ++r)
        CHECK(c[static_cast<std::size_t>(r)] == (r == 1 ? thrown::numeric : thrown::comm));
      CHECK(d == c);
      for (std::size_t r = 0; r < cpus.size(); ++r) {
        CHECK(same_bits(before_cpu[r], cpus[r].state().residual()));
        CHECK(same_bits(before_dev[r], device_residual(devs[r])));
      }
      // The checksum option reads payloads on the host: every rank's config_error.
      auto const sum = run_failing<true>(w, [&](auto& comm, int r) {
        gc::cuda::device_buffer g = to_device(gradient(n, r, 3));
        gc::cuda::device_buffer out = to_device(std::vector<float>(n));
        gc::all_reduce_low_rank(comm, devs[static_cast<std::size_t>(r)],
                                gc::tensor_view<float const>(std::span<float const>(floats(g, n)), id),
                                floats(out, n), rank_context(0, 3), {.checksum = true});
      });
      for (thrown t : sum) CHECK(t == thrown::config);
      for (std::size_t r = 0; r < cpus.size(); ++r) CHECK(same_bits(before_dev[r], device_residual(devs[r])));
    }
  }
}
