// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The small harness of the multi-rank GPU programs (nccl_comm.cu, collective_gpu.cu): ranks are
// threads, and Catch2's assertions are not thread-safe, so failures are counted and printed
// here; `device_count_or_skip` is the check that makes a program report itself skipped (exit
// code 77) on a machine without a usable CUDA device.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

namespace gpu_harness {

inline std::atomic<int> failures{0};
inline std::mutex print_mutex;

// Counts and prints a failed check of rank `rank` of `n`.
inline void expect(bool ok, int rank, int n, std::string const& what) {
  if (!ok) {
    std::lock_guard lock(print_mutex);
    std::fprintf(stderr, "FAILED on rank %d of %d: %s\n", rank, n, what.c_str());
    ++failures;
  }
}

// Throws std::runtime_error naming `what` unless `e` is cudaSuccess.
inline void cuda_ok(cudaError_t e, char const* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// The number of usable CUDA devices; 0 (after printing why) when there is none.
inline int device_count_or_skip() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no usable CUDA device: skipped\n");
    return 0;
  }
  return devices;
}

}  // namespace gpu_harness
