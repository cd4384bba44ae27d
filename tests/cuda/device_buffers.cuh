// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Test support of the host-emulated collective tests (collective_host.cu, two_way_host.cu,
// bucket_host.cu): their inputs (gradients, rank contexts, the codec pairs of two_way_host.cu
// and bucket_host.cu), host vectors copied into emulated device memory and back, the bitwise
// comparison of results, and what each rank of a failing step threw. Host emulation only (Thrust's
// CPP device system): "device" memory is host memory there, so the copies are memcpy.

#pragma once

#include <catch2/catch.hpp>

#include "emulated_nccl.cuh"

#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/cuda/cast.cuh>
#include <gradcomp/cuda/dithering.cuh>
#include <gradcomp/cuda/int8.cuh>
#include <gradcomp/cuda/memory.cuh>
#include <gradcomp/cuda/onebit.cuh>
#include <gradcomp/cuda/randomk.cuh>
#include <gradcomp/cuda/topk.cuh>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <span>
#include <vector>

#if GRADCOMP_CUDA_ON_GPU
#  error "device_buffers.cuh is for the host emulation: build with THRUST_DEVICE_SYSTEM_CPP"
#endif

namespace gct {

// A gradient of n elements drawn from `seed`: normal values (fp16-safe), an exact +0 at n / 3,
// a -0 at n / 7 and a value 40 times larger at n - 11, where n allows.
inline std::vector<float> gradient_of(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& v : g) v = normal(rng);
  if (n > 3) g[n / 3] = 0.0f;
  if (n > 7) g[n / 7] = -0.0f;
  if (n > 11) g[n - 11] *= 40.0f;
  return g;
}

// The codec context of rank r at a step: seed `base + r` (each rank its own rounding noise), or
// `base` on every rank when `shared` (shared-support codecs: the collectives check that the
// ranks agree on it).
inline gc::codec_context rank_context_of(int r, std::uint32_t step, std::uint64_t base, bool shared = false) {
  gc::codec_context ctx;
  ctx.seed = base + (shared ? 0u : static_cast<std::uint64_t>(r));
  ctx.step = step;
  return ctx;
}

// A device copy of `v`.
inline gc::cuda::device_buffer to_device(std::vector<float> const& v) {
  gc::cuda::device_buffer b;
  b.resize(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// `fn(name, cpu codec, device codec)` for each CPU codec and its device twin of the two-way,
// bucketed and pipeline cases: summable, gathered and shared support, deterministic and
// stochastic, bucketed statistics, and two sparsifiers (`name` is the codec's spec).
template <class Fn>
void for_each_codec_pair(Fn&& fn) {
  using r = gc::int8_rounding;
  fn("fp16", gc::fp16_codec{}, gc::cuda::fp16_codec{});
  fn("bf16", gc::bf16_codec{}, gc::cuda::bf16_codec{});
  fn("int8", gc::int8_codec{}, gc::cuda::int8_codec{});
  fn("int8:bucket=100,rounding=stochastic", gc::int8_codec{100, r::stochastic},
     gc::cuda::int8_codec{100, r::stochastic});
  fn("onebit", gc::onebit_codec{}, gc::cuda::onebit_codec{});
  fn("qsgd", gc::qsgd_codec{}, gc::cuda::qsgd_codec{});
  fn("dithering:levels=5,norm=l2,bucket=16",
     gc::dithering_codec{5, gc::dither_partition::linear, gc::dither_norm::l2, 16},
     gc::cuda::dithering_codec{5, gc::dither_partition::linear, gc::dither_norm::l2, 16});
  fn("topk:ratio=0.1", gc::topk_codec::ratio(0.1), gc::cuda::topk_codec::ratio(0.1));
  fn("randomk:ratio=0.25,scale=true", gc::scaled_random_k_codec::ratio(0.25),
     gc::cuda::scaled_random_k_codec::ratio(0.25));
}

// Whether codec (or packet source) `c` selects a support shared by every rank.
template <class C>
bool shared_support(C const& c) {
  return gc::detail::aggregation_of(c) == gc::aggregation_kind::shared_support;
}

// A host copy of floats in emulated device memory.
inline std::vector<float> to_host(std::span<float const> d) { return {d.begin(), d.end()}; }

// The first `n` floats of `b`, as a span of device memory.
inline std::span<float> floats(gc::cuda::device_buffer& b, std::size_t n) {
  return {reinterpret_cast<float*>(b.data()), n};
}

// A host copy of the first `n` floats of `b`.
inline std::vector<float> to_host(gc::cuda::device_buffer const& b, std::size_t n) {
  return to_host(std::span<float const>(reinterpret_cast<float const*>(b.data()), n));
}

// Whether `a` and `b` hold the same floats, bit for bit.
inline bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// For each of `steps` steps s: `cpu(comm, r, s)` on w in-process ranks and `dev(comm, r, s)` on
// w emulated device ranks (an `emulated_nccl` logging to a fresh `traffic`), each returning rank
// r's State; then `check(want, got, log)` with the two runs' states in rank order.
template <class State, class Cpu, class Dev, class Check>
void compare_steps(int w, int steps, Cpu&& cpu, Dev&& dev, Check&& check) {
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    auto const s = static_cast<std::uint32_t>(step);
    std::vector<State> want(static_cast<std::size_t>(w)), got(want.size());
    REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& comm) {
      want[static_cast<std::size_t>(comm.rank())] = cpu(comm, comm.rank(), s);
    }));
    traffic log;
    REQUIRE_NOTHROW(gc::run_in_process(w, [&](gc::in_process_communicator& inner) {
      emulated_nccl comm(inner, log);
      got[static_cast<std::size_t>(comm.rank())] = dev(comm, comm.rank(), s);
    }));
    check(want, got, log);
  }
}

// What each rank of a failing step threw.
enum class thrown { nothing, comm, numeric, config, other };

inline thrown classify(std::exception_ptr e) {
  if (!e) return thrown::nothing;
  try {
    std::rethrow_exception(e);
  } catch (gc::comm_error const&) {
    return thrown::comm;
  } catch (gc::numeric_error const&) {
    return thrown::numeric;
  } catch (gc::config_error const&) {
    return thrown::config;
  } catch (...) {
    return thrown::other;
  }
}

// Runs `body(comm, rank)` on w ranks (emulated device ranks when `Device`, else plain
// in-process ones), collecting what each threw (run_in_process would rethrow only the first),
// with a short timeout: a hang fails the test. Device ranks never mix host and device buffers in
// one operation.
template <bool Device, class Body>
std::vector<thrown> run_failing(int w, Body&& body) {
  std::vector<thrown> got(static_cast<std::size_t>(w), thrown::nothing);
  traffic log;
  auto const t0 = std::chrono::steady_clock::now();
  gc::run_in_process(
      w,
      [&](gc::in_process_communicator& inner) {
        try {
          if constexpr (Device) {
            emulated_nccl comm(inner, log);
            body(comm, comm.rank());
          } else {
            body(inner, inner.rank());
          }
        } catch (...) {
          got[static_cast<std::size_t>(inner.rank())] = classify(std::current_exception());
        }
      },
      std::chrono::seconds(20));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));
  CHECK(log.mixed == 0);
  return got;
}

}  // namespace gct
