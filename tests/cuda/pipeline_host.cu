// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// `gradient_pipeline` with a device source (pipeline/pipeline.hpp: float32 and 16-bit device
// gradients, every device codec with feedback "residual" or "none", flat buckets or two-way
// compression, the divergence guard's raise and skip), checked on a machine without a GPU against
// the CPU pipeline with the CPU codec of the same format on the same inputs.
//
// What is real and what is emulated (as in bucket_host.cu): real are the pipeline, its
// agreement round, the bucketed collective with the device memory space, the device codecs'
// header code, checks and passes, `cuda::device_compressor`, and the CPU pipeline they are
// compared with. Emulated: this file is built with Thrust's CPP device system, so "device"
// memory is host memory that cuda/memory.cuh records as device allocations, kernels run on the
// calling thread and streams are ignored; the communicator is `emulated_nccl`
// (emulated_nccl.cuh), which records which operations carried device payloads and which host
// control messages.
//
// Compared byte for byte over several steps on 2, 3 and 4 ranks: every rank's outputs, every
// residual, `save()` and the step's payload statistics; with bad inputs, the exception type each
// rank throws (the CPU pipeline's) and `save()` unchanged on every rank of both backends. The
// last case takes `device_mode` (pipeline/device_mode.hpp) on its own: its checkpoint sections.

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "device_buffers.cuh"
#include "emulated_nccl.cuh"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/cuda/cast.cuh>
#include <gradcomp/cuda/collective.cuh>
#include <gradcomp/cuda/dithering.cuh>
#include <gradcomp/cuda/int8.cuh>
#include <gradcomp/cuda/memory.cuh>
#include <gradcomp/cuda/onebit.cuh>
#include <gradcomp/cuda/powersgd.cuh>
#include <gradcomp/cuda/randomk.cuh>
#include <gradcomp/cuda/topk.cuh>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/pipeline/checkpoint.hpp>
#include <gradcomp/pipeline/device_mode.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

using gc::cuda::memory_kind;
using gc::cuda::memory_kind_of;
using namespace gct;  // NOLINT(google-build-using-namespace): the test support

namespace {

// ---------------------------------------------------------------------------------------------
// The layout (bucket_host.cu's): eleven tensors of odd sizes. With min_compress_elements = 100
// and buckets of 3000 float32 elements, 3, 17, 0, 64 and 1 go dense (one bucket), and the
// compressed ones make three buckets: {1000, 1200}, {4099} and {513, 1531, 700}.

std::vector<std::size_t> const sizes = {3, 1000, 17, 1200, 0, 4099, 513, 64, 1531, 1, 700};
constexpr std::size_t compressed_tensors = 6;

gc::tensor_id id_of(std::size_t i) { return gc::tensor_id{static_cast<std::uint32_t>(10 + i)}; }

// Host messages of a step: the agreement, layout and outcome rounds (at most 64 bytes) and
// the divergence guard's round, 2T + 2 doubles for the T = 11 tensors.
constexpr std::size_t control_bound = 8 * (2 * 11 + 2);

// The pipeline's options; the divergence guard on (its default policy) unless `guard` says.
gc::pipeline_options options(std::string codec, std::string feedback, bool pipelined = true,
                             std::string guard = "raise") {
  gc::pipeline_options o;
  o.codec = std::move(codec);
  o.feedback = std::move(feedback);
  o.guard = std::move(guard);
  o.measured_timing = false;  // so that save() holds no wall-clock times
  o.seed = 0xb0c4e700u;
  o.buckets.bucket_bytes = 4 * 3000;
  o.buckets.min_compress_elements = 100;
  o.buckets.pipeline = pipelined;
  return o;
}

// Gradient of tensor i on rank r at a step.
std::vector<float> gradient(std::size_t i, int r, std::uint32_t step) {
  return gradient_of(sizes[i],
                     1000u * static_cast<unsigned>(r) + 17u * step + 7919u * i + sizes[i]);
}
std::vector<std::vector<float>> gradients(int r, std::uint32_t step) {
  std::vector<std::vector<float>> g;
  for (std::size_t i = 0; i < sizes.size(); ++i) g.push_back(gradient(i, r, step));
  return g;
}

// One rank after a step: every output, every residual (host copies), save() and the statistics.
struct rank_state {
  std::vector<std::vector<float>> out;
  std::vector<std::vector<float>> residual;
  std::vector<std::byte> saved;
  gc::pipeline_stats stats;
  bool residuals_on_device = true;
};

void expect_same(std::vector<rank_state> const& want, std::vector<rank_state> const& got) {
  REQUIRE(want.size() == got.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(want[r].out.size() == got[r].out.size());
    for (std::size_t t = 0; t < want[r].out.size(); ++t) {
      INFO("tensor " << t << " of " << sizes[t] << " elements");
      CHECK(same_bits(want[r].out[t], got[r].out[t]));
      CHECK(same_bits(want[r].residual[t], got[r].residual[t]));
    }
    CHECK(want[r].saved == got[r].saved);
    CHECK(got[r].residuals_on_device);
    CHECK(want[r].stats.step == got[r].stats.step);
    CHECK(want[r].stats.bytes_sent == got[r].stats.bytes_sent);
    CHECK(want[r].stats.buckets == got[r].stats.buckets);
    CHECK(want[r].stats.tensors == got[r].stats.tensors);
    CHECK(want[r].stats.compressed_tensors == got[r].stats.compressed_tensors);
    if (got[r].stats.guard == gc::guard_action::none && got[r].stats.sent != gc::send_kind::dense)
      CHECK(got[r].stats.compressed_tensors == compressed_tensors);
    CHECK(want[r].stats.factor == got[r].stats.factor);
    // The guard's norms: the same bits (the canonical sum of squares on both backends).
    CHECK(want[r].stats.guard == got[r].stats.guard);
    CHECK(std::bit_cast<std::uint64_t>(want[r].stats.gradient_norm) ==
          std::bit_cast<std::uint64_t>(got[r].stats.gradient_norm));
    CHECK(std::bit_cast<std::uint64_t>(want[r].stats.residual_norm) ==
          std::bit_cast<std::uint64_t>(got[r].stats.residual_norm));
    // The compression gain (`measure_gain`; NaN alike when not measured).
    CHECK(std::bit_cast<std::uint64_t>(want[r].stats.gain) == std::bit_cast<std::uint64_t>(got[r].stats.gain));
  }
}

// What the training loop tells every step (a controller's statistics: GraVAC needs the batch
// size; the backward time is a constant, so that the decisions are reproducible).
gc::pipeline_step_info step_info() {
  gc::pipeline_step_info info;
  info.batch_size = 32;
  info.backprop_s = 0.01;
  return info;
}

// One CPU step of rank r: host gradients averaged in place.
template <class Comm>
rank_state cpu_step(Comm& comm, gc::gradient_pipeline& pipe,
                    std::vector<std::vector<float>> grads) {
  std::vector<gc::tensor_view<float>> views;
  for (std::size_t i = 0; i < grads.size(); ++i)
    views.emplace_back(std::span<float>(grads[i]), id_of(i));
  rank_state st;
  st.stats = pipe.step(comm, views, step_info());
  st.out = std::move(grads);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto const e = pipe.feedback_state(id_of(i));
    st.residual.emplace_back(e.begin(), e.end());
  }
  st.saved = pipe.save();
  return st;
}

// One device step of rank r: the gradients copied into device buffers, averaged there; with
// `overlapped`, through begin / submit (two halves) / finish instead of step.
template <class Comm>
rank_state device_step(Comm& comm, gc::gradient_pipeline& pipe,
                       std::vector<std::vector<float>> const& grads, bool overlapped = false) {
  std::vector<gc::cuda::device_buffer> bufs;
  std::vector<gc::tensor_view<float>> views;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    bufs.push_back(to_device(grads[i]));
    views.emplace_back(floats(bufs.back(), grads[i].size()), id_of(i));
  }
  rank_state st;
  if (overlapped) {
    auto const half = static_cast<std::ptrdiff_t>(views.size() / 2);
    pipe.begin(comm, step_info());
    pipe.submit(std::vector<gc::tensor_view<float>>(views.begin(), views.begin() + half));
    pipe.submit(std::vector<gc::tensor_view<float>>(views.begin() + half, views.end()));
    st.stats = pipe.finish(comm);
  } else {
    st.stats = pipe.step(comm, views, step_info());
  }
  for (std::size_t i = 0; i < grads.size(); ++i)
    st.out.push_back(to_host(bufs[i], grads[i].size()));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto const e = pipe.feedback_state(id_of(i));
    if (!e.empty() && memory_kind_of(e.data()) != memory_kind::device)
      st.residuals_on_device = false;
    st.residual.push_back(to_host(e));
  }
  st.saved = pipe.save();
  return st;
}

// The device source of a CUDA codec for a feedback spec (PowerSGD: the codec without feedback,
// PowerSGD's sessions keep the residuals).
template <class D>
gc::gradient_pipeline device_pipeline(gc::pipeline_options const& o, D const& dc) {
  gc::cuda::stream_codec<D> sc(dc);
  if (o.feedback == "ef21")
    return gc::gradient_pipeline(o, gc::cuda::device_compressor<D, gc::cuda::device_ef21_rule>(std::move(sc)));
  if (o.feedback == "dgc")
    return gc::gradient_pipeline(o, gc::cuda::device_compressor<D, gc::cuda::device_dgc_rule>(std::move(sc)));
  if (o.feedback == "dgc:momentum=0.5,clip_norm=3") {
    return gc::gradient_pipeline(
        o, gc::cuda::device_compressor<D, gc::cuda::device_dgc_rule>(std::move(sc), gc::cuda::device_dgc_rule(0.5f, 3.0)));
  }
  if (o.feedback == "residual" && !o.codec.starts_with("powersgd"))
    return gc::gradient_pipeline(o, gc::cuda::device_compressor<D>(std::move(sc)));
  return gc::gradient_pipeline(o, std::move(sc));
}

// w ranks, each with a CPU pipeline and a device pipeline of the same configuration.
// Returns rank 0's statistics of every step (the resumed one last).
template <class D>
std::vector<gc::pipeline_stats> compare(char const* spec, D const& dc, std::string const& feedback, int w, int steps,
                                        bool pipelined, bool two_way = false, bool measure_gain = false,
                                        std::string const& controller = "") {
  INFO(spec << ", feedback " << feedback << ", " << w << " ranks"
            << (pipelined ? "" : ", not pipelined") << (two_way ? ", two-way" : "")
            << (measure_gain ? ", measure_gain" : "") << (controller.empty() ? "" : ", controller ")
            << controller);
  gc::pipeline_options o = options(spec, feedback, pipelined);
  o.two_way = two_way;
  o.measure_gain = measure_gain;
  o.controller = controller;
  std::vector<gc::pipeline_stats> seen;
  std::deque<gc::gradient_pipeline> cpus, devs;
  for (int r = 0; r < w; ++r) {
    cpus.emplace_back(o);
    devs.push_back(device_pipeline(o, dc));
  }
  compare_steps<rank_state>(
      w, steps,
      [&](auto& comm, int r, std::uint32_t s) {
        return cpu_step(comm, cpus[static_cast<std::size_t>(r)], gradients(r, s));
      },
      [&](auto& comm, int r, std::uint32_t s) {
        return device_step(comm, devs[static_cast<std::size_t>(r)], gradients(r, s));
      },
      [&](std::vector<rank_state> const& want, std::vector<rank_state> const& got, traffic& log) {
        expect_same(want, got);
        seen.push_back(got[0].stats);
        // Payloads on the device, control messages on the host, never mixed.
        CHECK(log.mixed == 0);
        CHECK(log.device_ops > 0);
        CHECK(log.host_max <= control_bound);
      });
  // Resuming: the CPU pipelines' checkpoints loaded into fresh CPU and device pipelines, which
  // then take the next step alike (and save alike).
  std::deque<gc::gradient_pipeline> cpus2, devs2;
  for (int r = 0; r < w; ++r) {
    std::vector<std::byte> const saved = cpus[static_cast<std::size_t>(r)].save();
    cpus2.emplace_back(o);
    devs2.push_back(device_pipeline(o, dc));
    cpus2.back().load(saved);
    devs2.back().load(saved);
    CHECK(devs2.back().save() == saved);
    CHECK(devs2.back().step_count() == static_cast<std::uint64_t>(steps));
  }
  auto const next = static_cast<std::uint32_t>(steps);
  compare_steps<rank_state>(
      w, 1,
      [&](auto& comm, int r, std::uint32_t) {
        return cpu_step(comm, cpus2[static_cast<std::size_t>(r)], gradients(r, next));
      },
      [&](auto& comm, int r, std::uint32_t) {
        return device_step(comm, devs2[static_cast<std::size_t>(r)], gradients(r, next));
      },
      [&](std::vector<rank_state> const& want, std::vector<rank_state> const& got, traffic&) {
        INFO("resumed");
        expect_same(want, got);
        seen.push_back(got[0].stats);
      });
  return seen;
}

}  // namespace

TEST_CASE("cuda pipeline: a device source gives the CPU pipeline's outputs, residuals and save()",
          "[cuda][pipeline]") {
  for_each_codec_pair([](char const* spec, auto const&, auto const& dc) {
    for (int w : {2, 3, 4}) {
      compare(spec, dc, "residual", w, 3, true);
      compare(spec, dc, "none", w, 2, true);
    }
    compare(spec, dc, "residual", 2, 2, false);
  });
}

TEST_CASE("cuda pipeline: measure_gain with a device source gives the CPU pipeline's gain to the bit",
          "[cuda][pipeline][gain]") {
  // ‖C(p)‖² / ‖p‖² over every rank's compressed tensors, p the input each feedback rule
  // compresses, with the outputs, states and save() of compare (expect_same checks the gain's
  // bits; a gain that is not measured is NaN on both).
  for_each_codec_pair([](char const* spec, auto const&, auto const& dc) {
    compare(spec, dc, "residual", 2, 3, true, false, true);
    compare(spec, dc, "none", 3, 2, true, false, true);
  });
  for (int w : {2, 3}) {
    compare("int8:bucket=100,rounding=stochastic", gc::cuda::int8_codec{100, gc::int8_rounding::stochastic}, "ef21",
            w, 3, true, false, true);
    compare("int8", gc::cuda::int8_codec{}, "dgc:momentum=0.5,clip_norm=3", w, 3, true, false, true);
  }
  compare("topk:ratio=0.1", gc::cuda::topk_codec::ratio(0.1), "dgc", 4, 3, false, false, true);
  // Two-way compression measures nothing per tensor: a gain of 1 on both.
  compare("int8", gc::cuda::int8_codec{}, "residual", 2, 2, true, true, true);
  // The gain is measured (not NaN) and below one for a lossy codec.
  gc::pipeline_options o = options("topk:ratio=0.1", "residual");
  o.measure_gain = true;
  std::deque<gc::gradient_pipeline> devs;
  for (int r = 0; r < 2; ++r) devs.push_back(device_pipeline(o, gc::cuda::topk_codec::ratio(0.1)));
  std::vector<double> gains(2);
  traffic log;
  gc::run_in_process(2, [&](gc::in_process_communicator& inner) {
    emulated_nccl comm(inner, log);
    auto const r = static_cast<std::size_t>(comm.rank());
    gains[r] = device_step(comm, devs[r], gradients(comm.rank(), 0)).stats.gain;
  });
  for (double g : gains) {
    CHECK(g > 0.0);
    CHECK(g < 1.0);
    CHECK(g == gains[0]);
  }
}

TEST_CASE("cuda pipeline: EF21 and DGC with a device source equal the CPU pipeline's",
          "[cuda][pipeline][feedback]") {
  // device_compressor<C, device_ef21_rule> / <C, device_dgc_rule>: outputs (EF21: the
  // receivers' estimates), states (h; DGC's [u | v]) and save() (with EF21's receivers) the
  // CPU pipeline's, and a CPU checkpoint resumed on the device (compare's second half).
  for (int w : {2, 3}) {
    compare("int8:bucket=100,rounding=stochastic", gc::cuda::int8_codec{100, gc::int8_rounding::stochastic}, "ef21",
            w, 3, true);
    compare("onebit", gc::cuda::onebit_codec{}, "ef21", w, 3, true);
    compare("int8", gc::cuda::int8_codec{}, "dgc", w, 3, true);
    compare("int8", gc::cuda::int8_codec{}, "dgc:momentum=0.5,clip_norm=3", w, 3, true);
  }
  for_each_codec_pair([](char const* spec, auto const&, auto const& dc) {
    compare(spec, dc, "ef21", 2, 2, true);
    compare(spec, dc, "dgc", 2, 2, true);
  });
  // The source's rule must be the spec's, with DGC's parameters.
  gc::pipeline_options o = options("int8", "dgc:momentum=0.5");
  CHECK_THROWS_AS(gc::gradient_pipeline(o, gc::cuda::device_compressor<gc::cuda::int8_codec, gc::cuda::device_dgc_rule>(
                                               gc::cuda::stream_codec<gc::cuda::int8_codec>{})),
                  gc::config_error);
  o.feedback = "ef21";
  CHECK_THROWS_AS(gc::gradient_pipeline(o, gc::cuda::device_compressor<gc::cuda::int8_codec, gc::cuda::device_dgc_rule>(
                                               gc::cuda::stream_codec<gc::cuda::int8_codec>{})),
                  gc::config_error);
  CHECK_NOTHROW(gc::gradient_pipeline(o, gc::cuda::device_compressor<gc::cuda::int8_codec, gc::cuda::device_ef21_rule>(
                                             gc::cuda::stream_codec<gc::cuda::int8_codec>{})));
}

TEST_CASE("cuda pipeline: controllers with a device source equal the CPU pipeline's",
          "[cuda][pipeline][controller]") {
  // Static, schedule (with a dense step), GraVAC (several levels measured each step, the
  // further ones re-compressed from the first packet) and Accordion (layer accumulators in
  // device memory, saved and resumed) over every sparsifier with a selection size and every
  // feedback rule: outputs, states, save(), factor and gain the CPU pipeline's.
  std::vector<std::string> const controllers = {"static:factor=8", "schedule:0=8,2=1,3=16",
                                                "gravac:theta_min=4,theta_max=64,window=2",
                                                "accordion:low=2,high=8,interval=2,accumulation=2"};
  for (std::string const& ctl : controllers) {
    compare("topk:ratio=0.1", gc::cuda::topk_codec::ratio(0.1), "residual", 2, 4, true, false, false, ctl);
    compare("topk:ratio=0.1,values=f16", gc::cuda::topk_codec::ratio(0.1, gc::sparse_values::f16), "none", 3, 4,
            true, false, true, ctl);
    compare("approx_topk:ratio=0.1", gc::cuda::approx_topk_codec::ratio(0.1), "ef21", 2, 4, true, false, true, ctl);
    compare("randomk:ratio=0.25,scale=true", gc::cuda::scaled_random_k_codec::ratio(0.25), "residual", 2, 4, false,
            false, true, ctl);
    compare("randomk:ratio=0.25,values=bf16", gc::cuda::random_k_codec::ratio(0.25, gc::sparse_values::bf16),
            "dgc:momentum=0.5,clip_norm=3", 3, 4, true, false, false, ctl);
  }
  // What these runs cover: GraVAC sends its candidate (factor 8, the packet re-compressed on
  // the host from the θmin packet) and later its θmin packet (factor 4); the schedule a dense
  // step (factor 1) between compressed ones.
  std::vector<gc::send_kind> sent;
  std::vector<double> factors;
  for (auto const& st : compare("topk:ratio=0.1", gc::cuda::topk_codec::ratio(0.1), "residual", 2, 4, true, false,
                                true, "gravac:theta_min=4,theta_max=64,window=2")) {
    sent.push_back(st.sent);
    factors.push_back(st.factor);
  }
  CHECK(sent == std::vector<gc::send_kind>{gc::send_kind::candidate, gc::send_kind::candidate, gc::send_kind::minimum,
                                           gc::send_kind::minimum, gc::send_kind::minimum});
  CHECK(factors == std::vector<double>{8, 8, 4, 4, 4});
  sent.clear();
  factors.clear();
  for (auto const& st : compare("topk:ratio=0.1", gc::cuda::topk_codec::ratio(0.1), "ef21", 2, 4, true, false,
                                true, "schedule:0=8,2=1,3=16")) {
    sent.push_back(st.sent);
    factors.push_back(st.factor);
  }
  CHECK(sent[2] == gc::send_kind::dense);
  CHECK(factors == std::vector<double>{8, 8, 1, 16, 16});
}

TEST_CASE("cuda pipeline: two-way compression with a device source equals the CPU pipeline's",
          "[cuda][pipeline][two_way]") {
  // The worker and server residuals live in the device source's two-way compressor; save()
  // carries them (host copies) in the CPU pipeline's format, and a CPU checkpoint resumes on
  // the device (compare's second half).
  for_each_codec_pair([](char const* spec, auto const&, auto const& dc) {
    for (int w : {2, 3}) {
      compare(spec, dc, "residual", w, 3, true, true);
      compare(spec, dc, "none", w, 2, true, true);
    }
  });
}

// PowerSGD with the built-in GEMM order (the device's) and sessions for the tensors of at least
// 100 elements: with the default shapes (n / c × c, c the largest divisor up to √n) 1000, 1200,
// 700 and 513 are low-rank matrices, 4099 and 1531 (primes, n × 1) dense ones.
constexpr char const* powersgd_spec = "powersgd:rank=2,min_elements=100,backend=builtin";

TEST_CASE("cuda pipeline: PowerSGD with a device source equals the CPU pipeline's",
          "[cuda][pipeline][powersgd]") {
  // The sessions' factors, warm starts and residuals live on the device; save() carries them
  // (host copies) in the CPU pipeline's format, and a CPU checkpoint resumes on the device.
  for (int w : {2, 3, 4}) {
    compare(powersgd_spec, gc::cuda::identity_codec{}, "residual", w, 3, true);
    compare(powersgd_spec, gc::cuda::identity_codec{}, "none", w, 2, true);
  }
  // The source: one without residuals, whose memory space makes sessions.
  gc::pipeline_options const o = options(powersgd_spec, "residual");
  CHECK_THROWS_AS(gc::gradient_pipeline(o, gc::cuda::device_compressor<gc::cuda::identity_codec>(
                                               gc::cuda::stream_codec<gc::cuda::identity_codec>{})),
                  gc::config_error);
  CHECK_THROWS_AS(gc::gradient_pipeline(o, gc::cuda::stream_codec<gc::cuda::int8_codec>{}),
                  gc::config_error);
}

TEST_CASE("cuda pipeline: begin / submit / finish with a device source equals the CPU step",
          "[cuda][pipeline]") {
  for (int w : {2, 3}) {
    INFO(w << " ranks");
    gc::pipeline_options const o = options("int8:bucket=100,rounding=stochastic", "residual");
    std::deque<gc::gradient_pipeline> cpus, devs;
    for (int r = 0; r < w; ++r) {
      cpus.emplace_back(o);
      devs.push_back(device_pipeline(o, gc::cuda::int8_codec{100, gc::int8_rounding::stochastic}));
    }
    compare_steps<rank_state>(
        w, 3,
        [&](auto& comm, int r, std::uint32_t s) {
          return cpu_step(comm, cpus[static_cast<std::size_t>(r)], gradients(r, s));
        },
        [&](auto& comm, int r, std::uint32_t s) {
          return device_step(comm, devs[static_cast<std::size_t>(r)], gradients(r, s), true);
        },
        [&](std::vector<rank_state> const& want, std::vector<rank_state> const& got, traffic& log) {
          expect_same(want, got);
          CHECK(log.mixed == 0);
        });
  }
}

TEST_CASE("cuda pipeline: bad inputs fail the device step as the CPU step, state unchanged",
          "[cuda][pipeline][failure]") {
  enum class mode { flat, two_way, powersgd, ef21, dgc, gravac, accordion };
  for (auto const& [w, m] : {std::pair{2, mode::flat}, std::pair{3, mode::flat}, std::pair{4, mode::flat},
                            std::pair{2, mode::two_way}, std::pair{3, mode::two_way},
                            std::pair{2, mode::powersgd}, std::pair{3, mode::powersgd},
                            std::pair{2, mode::ef21}, std::pair{3, mode::ef21}, std::pair{3, mode::dgc},
                            std::pair{2, mode::gravac}, std::pair{3, mode::accordion}}) {
    INFO(w << " ranks, mode " << static_cast<int>(m));
    // The guard off: the codecs' own checks (the guard's are the next test's). Two-way: the
    // worker and server residuals are rolled back; PowerSGD: the sessions (save() compares
    // them all).
    char const* const feedback = m == mode::ef21 ? "ef21" : m == mode::dgc ? "dgc:momentum=0.5,clip_norm=3" : "residual";
    // A controller (GraVAC: its state and history; Accordion: the layer accumulators) over
    // top-k: the controller and the accumulators rolled back as well.
    bool const controlled = m == mode::gravac || m == mode::accordion;
    gc::pipeline_options o =
        options(m == mode::powersgd ? powersgd_spec : controlled ? "topk:ratio=0.1" : "int8", feedback, true, "off");
    o.two_way = m == mode::two_way;
    if (m == mode::gravac) o.controller = "gravac:theta_min=4,theta_max=64,window=2";
    if (m == mode::accordion) o.controller = "accordion:low=2,high=8,interval=2,accumulation=2";
    std::deque<gc::gradient_pipeline> cpus, devs;
    for (int r = 0; r < w; ++r) {
      cpus.emplace_back(o);
      if (m == mode::powersgd) devs.push_back(device_pipeline(o, gc::cuda::identity_codec{}));
      else if (controlled) devs.push_back(device_pipeline(o, gc::cuda::topk_codec::ratio(0.1)));
      else devs.push_back(device_pipeline(o, gc::cuda::int8_codec{}));
    }
    auto cpu = [&](auto& comm, int r, std::vector<std::vector<float>> const& g) {
      (void)cpu_step(comm, cpus[static_cast<std::size_t>(r)], g);
    };
    auto dev = [&](auto& comm, int r, std::vector<std::vector<float>> const& g) {
      (void)device_step(comm, devs[static_cast<std::size_t>(r)], g);
    };
    auto saves = [&] {
      std::vector<std::vector<std::byte>> s;
      for (auto const& p : cpus) s.push_back(p.save());
      for (auto const& p : devs) s.push_back(p.save());
      return s;
    };
    // A first step that succeeds everywhere: residuals to keep.
    for (thrown t : run_failing<false>(w, [&](auto&c, int r) { cpu(c, r, gradients(r, 0)); }))
      CHECK(t == thrown::nothing);
    for (thrown t : run_failing<true>(w, [&](auto&c, int r) { dev(c, r, gradients(r, 0)); }))
      CHECK(t == thrown::nothing);
    auto const before = saves();
    auto const uw = static_cast<std::size_t>(w);
    for (std::size_t r = 0; r < uw; ++r) CHECK(before[r] == before[uw + r]);

    // Each bad input: the CPU pipeline's exception on every rank, then every save() as it was.
    auto expect_failure = [&](char const* what, auto&& grads_of, auto&& skip) {
      INFO(what);
      auto const got_cpu = run_failing<false>(w, [&](auto& c, int r) {
        if (skip(r)) throw std::runtime_error("rank lost");
        cpu(c, r, grads_of(r));
      });
      auto const got_dev = run_failing<true>(w, [&](auto& c, int r) {
        if (skip(r)) throw std::runtime_error("rank lost");
        dev(c, r, grads_of(r));
      });
      for (thrown t : got_cpu) CHECK(t != thrown::nothing);
      CHECK(got_dev == got_cpu);
      CHECK(saves() == before);
      return got_cpu;
    };
    auto none = [](int) { return false; };
    auto rank1 = [&](auto edit) {
      return [=](int r) {
        auto g = gradients(r, 1);
        if (r == 1) edit(g);
        return g;
      };
    };
    // Rank 1 passes 999 elements for tensor 3 (1200 elsewhere): the agreement round fails.
    auto const mismatch =
        expect_failure("mismatched sizes", rank1([](auto& g) { g[3].resize(999); }), none);
    CHECK(mismatch[1] == thrown::config);
    // A NaN on rank 1 in the last compressed bucket (tensor 8) and in the first (tensor 1):
    // rank 1's numeric_error, comm_error on the others.
    std::vector<thrown> nan_want(uw, thrown::comm);
    nan_want[1] = thrown::numeric;
    CHECK(expect_failure("NaN in the last bucket",
                         rank1([](auto& g) { g[8][100] = std::nanf(""); }), none) == nan_want);
    CHECK(expect_failure("NaN in the first bucket", rank1([](auto& g) { g[1][0] = std::nanf(""); }),
                         none) == nan_want);
    // The last rank disappears before the step: comm_error on every other rank.
    std::vector<thrown> lost(uw, thrown::comm);
    lost[uw - 1] = thrown::other;
    CHECK(expect_failure(
              "a vanished rank", [&](int r) { return gradients(r, 1); },
              [&](int r) { return r == w - 1; }) == lost);

    // A malformed checkpoint: format_error, every residual kept.
    std::vector<std::byte> bad = before[uw];
    bad.resize(bad.size() - 5);
    for (auto& d : devs) CHECK_THROWS_AS(d.load(bad), gc::format_error);
    CHECK(saves() == before);

    // After the failures both backends take the next step alike.
    compare_steps<rank_state>(
        w, 1,
        [&](auto& comm, int r, std::uint32_t) {
          return cpu_step(comm, cpus[static_cast<std::size_t>(r)], gradients(r, 2));
        },
        [&](auto& comm, int r, std::uint32_t) {
          return device_step(comm, devs[static_cast<std::size_t>(r)], gradients(r, 2));
        },
        [&](std::vector<rank_state> const& want, std::vector<rank_state> const& got, traffic&) {
          expect_same(want, got);
          for (auto const& s : got) CHECK(s.stats.step == 1);
        });
  }
}

TEST_CASE("cuda pipeline: the divergence guard decides on a device source as on the CPU",
          "[cuda][pipeline][guard]") {
  // Steps 0-2 normal (the history), step 3 with rank 1's tensor 5 blown up 1e4 times (a
  // gradient norm far above 10 times the median), step 4 normal again.
  auto grads = [](int r, std::uint32_t s) {
    auto g = gradients(r, s);
    if (s == 3 && r == 1) {
      for (float& v : g[5]) v *= 1e4f;
    }
    return g;
  };
  for (int w : {2, 3}) {
    INFO(w << " ranks");
    // skip: the step is skipped on every rank of both backends alike (outputs zero, residuals,
    // history and step counter kept), and the next step goes through alike. dense: the step
    // sends every g dense (residuals kept), flat or two-way; with a residual that trips
    // (residual_factor 2, the gradient's limit out of reach) every residual is reset.
    auto run_policy = [&](std::string const& guard, bool two_way, int steps,
                          std::vector<gc::guard_action> const& want_actions, bool reset) {
      INFO(guard << (two_way ? ", two-way" : ""));
      gc::pipeline_options o = options("int8", "residual", true, guard);
      o.two_way = two_way;
      std::deque<gc::gradient_pipeline> cpus, devs;
      for (int r = 0; r < w; ++r) {
        cpus.emplace_back(o);
        devs.push_back(device_pipeline(o, gc::cuda::int8_codec{}));
      }
      std::vector<gc::guard_action> actions;
      compare_steps<rank_state>(
          w, steps,
          [&](auto& comm, int r, std::uint32_t s) {
            return cpu_step(comm, cpus[static_cast<std::size_t>(r)], grads(r, s));
          },
          [&](auto& comm, int r, std::uint32_t s) {
            return device_step(comm, devs[static_cast<std::size_t>(r)], grads(r, s));
          },
          [&](std::vector<rank_state> const& want, std::vector<rank_state> const& got, traffic& log) {
            expect_same(want, got);
            CHECK(log.mixed == 0);
            actions.push_back(got[0].stats.guard);
            if (got[0].stats.guard == gc::guard_action::skipped) {
              for (auto const& st : got) {
                for (auto const& o : st.out) CHECK(std::all_of(o.begin(), o.end(), [](float v) { return v == 0.0f; }));
              }
            }
            if (got[0].stats.guard == gc::guard_action::dense) {
              for (auto const& st : got) {
                CHECK(st.stats.sent == gc::send_kind::dense);
                CHECK(st.stats.compressed_tensors == 0);
                // reset: no residual left; kept: the compressed tensors' residuals stay
                std::size_t held = 0;
                for (auto const& e : st.residual) held += e.empty() ? 0 : 1;
                CHECK(held == (reset || two_way ? 0 : compressed_tensors));
              }
            }
          });
      CHECK(actions == want_actions);
      for (auto const& d : devs) {
        auto const& c = d.guard().counters();
        CHECK(c.skipped + c.dense == 1);
        CHECK(c.resets == (reset ? 1u : 0u));
      }
    };
    using gc::guard_action;
    run_policy("skip:warmup=2,window=4", false, 5,
               {guard_action::none, guard_action::none, guard_action::none, guard_action::skipped,
                guard_action::none},
               false);
    for (bool two_way : {false, true}) {
      run_policy("dense:warmup=2,window=4", two_way, 5,
                 {guard_action::none, guard_action::none, guard_action::none, guard_action::dense,
                  guard_action::none},
                 false);
    }
    run_policy("dense:warmup=2,window=4,factor=1e9,residual_factor=2", false, 6,
               {guard_action::none, guard_action::none, guard_action::none, guard_action::none,
                guard_action::dense, guard_action::none},
               true);
    // raise: numeric_error on every rank of both backends, every save() as before; a NaN on one
    // rank too (the guard's sum makes it every rank's).
    {
      gc::pipeline_options const o = options("int8", "residual", true, "raise:warmup=2,window=4");
      std::deque<gc::gradient_pipeline> cpus, devs;
      for (int r = 0; r < w; ++r) {
        cpus.emplace_back(o);
        devs.push_back(device_pipeline(o, gc::cuda::int8_codec{}));
      }
      for (std::uint32_t s = 0; s < 3; ++s) {
        for (thrown t : run_failing<false>(w, [&](auto& c, int r) {
               (void)cpu_step(c, cpus[static_cast<std::size_t>(r)], grads(r, s));
             }))
          CHECK(t == thrown::nothing);
        for (thrown t : run_failing<true>(w, [&](auto& c, int r) {
               (void)device_step(c, devs[static_cast<std::size_t>(r)], grads(r, s));
             }))
          CHECK(t == thrown::nothing);
      }
      auto saves = [&] {
        std::vector<std::vector<std::byte>> v;
        for (auto const& p : cpus) v.push_back(p.save());
        for (auto const& p : devs) v.push_back(p.save());
        return v;
      };
      auto const before = saves();
      for (std::size_t r = 0; r < static_cast<std::size_t>(w); ++r)
        CHECK(before[r] == before[static_cast<std::size_t>(w) + r]);
      auto fail_both = [&](auto&& grads_of) {
        auto const c = run_failing<false>(w, [&](auto& comm, int r) {
          (void)cpu_step(comm, cpus[static_cast<std::size_t>(r)], grads_of(r));
        });
        auto const d = run_failing<true>(w, [&](auto& comm, int r) {
          (void)device_step(comm, devs[static_cast<std::size_t>(r)], grads_of(r));
        });
        for (thrown t : c) CHECK(t == thrown::numeric);
        CHECK(d == c);
        CHECK(saves() == before);
      };
      fail_both([&](int r) { return grads(r, 3); });
      fail_both([&](int r) {
        auto g = gradients(r, 3);
        if (r == 1) g[1][7] = std::nanf("");
        return g;
      });
    }
  }
}

TEST_CASE("cuda pipeline: what a device source does not take is a config_error",
          "[cuda][pipeline][failure]") {
  using dev_codec = gc::cuda::int8_codec;
  auto build = [](gc::pipeline_options const& o) { return device_pipeline(o, dev_codec{}); };
  gc::pipeline_options const good = options("int8", "residual");
  CHECK_NOTHROW(build(good));
  std::vector<std::pair<char const*, gc::pipeline_options>> bad;
  auto with = [&](char const* what, auto edit) {
    gc::pipeline_options o = good;
    edit(o);
    bad.emplace_back(what, o);
  };
  with("a controller over a codec without a selection size", [](auto& o) {
    o.codec = "topk:ratio=0.01";
    o.controller = "static:factor=100";
  });
  // hierarchical is taken (its steps need set_hierarchical_groups: hierarchical_host.cu), but
  // not with EF21
  gc::pipeline_options hierarchical = good;
  hierarchical.hierarchical.nodes = gc::node_grouping::uniform(2);
  CHECK_NOTHROW(build(hierarchical));
  with("hierarchical with EF21", [](auto& o) {
    o.hierarchical.nodes = gc::node_grouping::uniform(2);
    o.feedback = "ef21";
  });
  with("another codec", [](auto& o) { o.codec = "fp16"; });
  with("another bucket size", [](auto& o) { o.codec = "int8:bucket=100"; });
  with("checksum", [](auto& o) { o.buckets.checksum = true; });
  with("a 16-bit small_format", [](auto& o) { o.buckets.small_format = gc::dense_format::f16; });
  for (auto const& [what, o] : bad) {
    INFO(what);
    CHECK_THROWS_AS(build(o), gc::config_error);
  }
  // feedback "residual" with a source that keeps none, "none" with one that keeps residuals
  CHECK_THROWS_AS(gc::gradient_pipeline(good, gc::cuda::stream_codec<dev_codec>{}),
                  gc::config_error);
  CHECK_THROWS_AS(gc::gradient_pipeline(
                      options("int8", "none"),
                      gc::cuda::device_compressor<dev_codec>(gc::cuda::stream_codec<dev_codec>{})),
                  gc::config_error);

  // load: a malformed checkpoint is a format_error, and changes nothing.
  gc::gradient_pipeline p = build(good);
  std::vector<std::byte> const saved = p.save();
  CHECK_NOTHROW(p.load(saved));
  std::vector<std::byte> truncated = saved;
  truncated.pop_back();
  CHECK_THROWS_AS(p.load(truncated), gc::format_error);
  CHECK(p.save() == saved);

  // Two-way: a checkpoint of another two-way setting, or a truncated one, is a format_error
  // that changes nothing.
  gc::pipeline_options tw = good;
  tw.two_way = true;
  gc::gradient_pipeline q = build(tw);
  std::vector<std::byte> const qsaved = q.save();
  CHECK_NOTHROW(q.load(qsaved));
  CHECK_THROWS_AS(q.load(saved), gc::format_error);
  CHECK_THROWS_AS(p.load(qsaved), gc::format_error);
  std::vector<std::byte> qtrunc = qsaved;
  qtrunc.pop_back();
  CHECK_THROWS_AS(q.load(qtrunc), gc::format_error);
  CHECK(q.save() == qsaved);
}

namespace {

// The raw 16-bit words of a tensor.
template <class T>
std::vector<std::uint16_t> words(std::span<T const> v) {
  std::vector<std::uint16_t> w(v.size());
  if (!v.empty()) std::memcpy(w.data(), v.data(), 2 * v.size());
  return w;
}

// Step `s` of 16-bit gradients (the float ones rounded to T) of rank r on the CPU pipeline
// (host tensors) or the device one (device tensors): the outputs' words, residuals, save().
template <class T, class Comm>
rank_state step16(Comm& comm, gc::gradient_pipeline& pipe, int r, std::uint32_t s, bool device,
                  std::vector<std::vector<std::uint16_t>>& outs) {
  std::vector<std::vector<T>> host;
  for (auto const& g : gradients(r, s)) {
    host.emplace_back(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) host.back()[i] = gc::from_float<T>(g[i]);
  }
  std::vector<gc::cuda::device_buffer> bufs;
  std::vector<gc::tensor_view<T>> views;
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (device) {
      bufs.emplace_back();
      bufs.back().resize(2 * host[i].size());
      if (!host[i].empty()) std::memcpy(bufs.back().data(), host[i].data(), 2 * host[i].size());
      views.emplace_back(std::span<T>(reinterpret_cast<T*>(bufs.back().data()), host[i].size()), id_of(i));
    } else {
      views.emplace_back(std::span<T>(host[i]), id_of(i));
    }
  }
  rank_state st;
  st.stats = pipe.step(comm, views);
  outs.clear();
  for (auto const& v : views) outs.push_back(words(std::span<T const>(v.span())));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto const e = pipe.feedback_state(id_of(i));
    st.residual.push_back(device ? to_host(e) : std::vector<float>(e.begin(), e.end()));
    st.out.emplace_back();  // compared as words below
  }
  st.saved = pipe.save();
  return st;
}

}  // namespace

TEST_CASE("cuda pipeline: 16-bit device gradients give the CPU pipeline's rounded results",
          "[cuda][pipeline]") {
  auto run = [](auto tag, char const* what) {
    using T = decltype(tag);
    for (int w : {2, 3}) {
      INFO(what << ", " << w << " ranks");
      gc::pipeline_options const o = options("int8:bucket=100,rounding=stochastic", "residual");
      std::deque<gc::gradient_pipeline> cpus, devs;
      for (int r = 0; r < w; ++r) {
        cpus.emplace_back(o);
        devs.push_back(device_pipeline(o, gc::cuda::int8_codec{100, gc::int8_rounding::stochastic}));
      }
      auto const uw = static_cast<std::size_t>(w);
      std::vector<std::vector<std::vector<std::uint16_t>>> out_cpu(uw), out_dev(uw);
      compare_steps<rank_state>(
          w, 3,
          [&](auto& comm, int r, std::uint32_t s) {
            return step16<T>(comm, cpus[static_cast<std::size_t>(r)], r, s, false, out_cpu[static_cast<std::size_t>(r)]);
          },
          [&](auto& comm, int r, std::uint32_t s) {
            return step16<T>(comm, devs[static_cast<std::size_t>(r)], r, s, true, out_dev[static_cast<std::size_t>(r)]);
          },
          [&](std::vector<rank_state> const& want, std::vector<rank_state> const& got, traffic& log) {
            expect_same(want, got);
            for (std::size_t r = 0; r < uw; ++r) CHECK(out_cpu[r] == out_dev[r]);
            CHECK(log.mixed == 0);
            CHECK(log.host_max <= control_bound);
          });
    }
  };
  run(gc::half{}, "float16");
  run(gc::bfloat16{}, "bfloat16");
}

// ---------------------------------------------------------------------------------------------
// device_mode (pipeline/device_mode.hpp) on its own: made from a source and the host mode of
// its options, it refuses a codec spec that does not describe its codec; its checkpoint
// sections are the CPU formats — a CPU pipeline's error-feedback section restored into it is
// written back byte for byte, with every residual (and EF21 receiver) in device memory equal to
// the CPU's; its PowerSGD and two-way sections are those of a host pipeline in another mode,
// and a two-way section with state is refused.

TEST_CASE(
    "cuda pipeline: device_mode restores and writes the checkpoint sections in the CPU formats",
    "[cuda][pipeline][device_mode]") {
  using dev_codec = gc::cuda::int8_codec;
  for (std::string const feedback : {"residual", "ef21"}) {
    CAPTURE(feedback);
    gc::pipeline_options const o = options("int8", feedback);
    gc::any_codec const base = gc::make_codec(o.codec);
    gc::feedback_compressor const comp = gc::make_feedback(o.feedback, base);
    // The mode of the device int8 codec for options `opt`, with the CPU codec `opt.codec` names.
    auto make = [&](gc::pipeline_options const& opt) {
      gc::any_codec const cpu_codec = gc::make_codec(opt.codec);
      gc::feedback_compressor const cpu_comp = gc::make_feedback(opt.feedback, cpu_codec);
      gc::cuda::stream_codec<dev_codec> sc(dev_codec{});
      if (feedback == "ef21") {
        return gc::device_mode(
            gc::cuda::device_compressor<dev_codec, gc::cuda::device_ef21_rule>(std::move(sc)),
            gc::flat_mode(cpu_codec, opt.buckets), opt, gc::pipeline_mode::flat, cpu_comp,
            cpu_codec);
      }
      return gc::device_mode(gc::cuda::device_compressor<dev_codec>(std::move(sc)),
                             gc::flat_mode(cpu_codec, opt.buckets), opt, gc::pipeline_mode::flat,
                             cpu_comp, cpu_codec);
    };
    gc::pipeline_options other = o;
    other.codec = "int8:bucket=100";
    CHECK_THROWS_AS(make(other), gc::config_error);

    gc::device_mode m = make(o);
    CHECK(std::holds_alternative<gc::flat_mode>(m.host()));
    CHECK(m.hierarchical() == nullptr);
    CHECK(m.tensors().empty());
    CHECK(m.feedback_section() == std::visit([](auto const& c) { return c.save(); }, comp));
    CHECK_NOTHROW(m.rollback());

    // A CPU pipeline's state after two steps on one rank.
    gc::gradient_pipeline cpu(o);
    REQUIRE_NOTHROW(gc::run_in_process(1, [&](gc::in_process_communicator& comm) {
      for (std::uint32_t s = 0; s < 2; ++s) (void)cpu_step(comm, cpu, gradients(0, s));
    }));
    std::vector<std::byte> const saved = cpu.save();
    gc::detail::checkpoint_reader r(
        saved, gc::checkpoint_config{o.codec, o.feedback, o.controller, o.two_way});
    std::vector<std::byte> const section = r.feedback();
    gc::feedback_compressor checked = comp;
    std::visit([&](auto& c) { c.load(section, gc::state_check::container); }, checked);
    m.load(m.restore_feedback(checked), {});
    CHECK(m.feedback_section() == section);
    CHECK(m.tensors().size() == compressed_tensors);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      INFO("tensor " << i);
      auto const want = cpu.feedback_state(id_of(i));
      auto const got = m.state(id_of(i));
      if (!got.empty()) CHECK(memory_kind_of(got.data()) == memory_kind::device);
      CHECK(same_bits(std::vector<float>(want.begin(), want.end()), to_host(got)));
    }

    // The PowerSGD and two-way sections: empty in the flat mode, as a host pipeline writes them.
    (void)r.controller();
    (void)r.accumulators();
    gc::detail::byte_reader& sections = r.mode_sections();
    gc::device_mode::restored none;
    m.read_sections(sections, none);
    CHECK(none.sessions.empty());
    CHECK(none.two_way.empty());
    gc::detail::byte_writer w, want;
    w.begin("TDVM", 1);
    want.begin("TDVM", 1);
    m.save(w);
    gc::low_rank_mode::save_none(want);
    gc::two_way_mode::save_none(want);
    CHECK(w.finish() == want.finish());

    gc::detail::byte_writer bad;
    bad.begin("TDVM", 1);
    gc::low_rank_mode::save_none(bad);
    bad.put_bytes(std::vector<std::byte>{std::byte{1}});
    std::vector<std::byte> const bad_bytes = bad.finish();
    gc::detail::byte_reader bad_reader(bad_bytes, "TDVM", 1, "device mode test");
    CHECK_THROWS_WITH(m.read_sections(bad_reader, none), Catch::Contains("holds two-way state"));
  }
}
