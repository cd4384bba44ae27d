// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Compiles and links <gradcomp/comm/c10d.hpp> through the installed package's gradcomp::torch:
// the adapter's operations are instantiated (a communicator is built by a function the program
// never calls without a process group), and a libtorch call runs.

#include <gradcomp/comm/c10d.hpp>
#include <gradcomp/version.hpp>

#include <torch/types.h>

#include <cstdio>
#include <memory>
#include <span>

#if defined(GRADCOMP_EXPECTED_MAJOR)
static_assert(GRADCOMP_VERSION_MAJOR == GRADCOMP_EXPECTED_MAJOR && GRADCOMP_VERSION_MINOR == GRADCOMP_EXPECTED_MINOR &&
                  GRADCOMP_VERSION_PATCH == GRADCOMP_EXPECTED_PATCH,
              "not the gradcomp under test");
#endif

// What a program over a real process group does: wrap it, all-reduce a buffer in place.
[[gnu::noinline]] float all_reduce_sum(c10::intrusive_ptr<::c10d::ProcessGroup> pg, std::span<float> x) {
  gradcomp::c10d_communicator comm(std::move(pg));
  comm.all_reduce(std::as_writable_bytes(x), gradcomp::comm_type::f32, gradcomp::reduce_op::sum);
  return x.empty() ? 0.0f : x[0];
}

int main(int argc, char**) {
  auto volatile call = &all_reduce_sum;  // kept and linked, called only with a process group
  if (argc > 100) {
    float v = 1.0f;
    call(c10::intrusive_ptr<::c10d::ProcessGroup>(), std::span<float>(&v, 1));
  }
  at::Tensor const t = at::ones({4}) * 2;
  float const sum = t.sum().item<float>();
  std::printf("gradcomp %d.%d.%d with libtorch: sum %.1f\n", GRADCOMP_VERSION_MAJOR, GRADCOMP_VERSION_MINOR,
              GRADCOMP_VERSION_PATCH, static_cast<double>(sum));
  return sum == 8.0f ? 0 : 1;
}
