// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Test support of the host-emulated collective tests (collective_host.cu, two_way_host.cu,
// bucket_host.cu): host vectors copied into emulated device memory and back, the bitwise
// comparison of results, and what each rank of a failing step threw. Host emulation only
// (Thrust's CPP device system): "device" memory is host memory there, so the copies are
// memcpy.

#pragma once

#include <catch2/catch.hpp>

#include "emulated_nccl.cuh"

#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/cuda/memory.cuh>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <span>
#include <vector>

#if GRADCOMP_CUDA_ON_GPU
#  error "device_buffers.cuh is for the host emulation: build with THRUST_DEVICE_SYSTEM_CPP"
#endif

namespace gct {

// A device copy of `v`.
inline gc::cuda::device_buffer to_device(std::vector<float> const& v) {
  gc::cuda::device_buffer b;
  b.resize(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
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
