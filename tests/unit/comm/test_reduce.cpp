// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// comm/reduce.hpp: the one host reduction. Its 16-bit sum runs on the SIMD conversion kernels in
// blocks; it must equal the element-wise definition bit for bit, across block boundaries and
// for the values that round (overflow to infinity, subnormals, ties), at the machine's ISA.

#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/cpu/isa.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <vector>

using namespace gradcomp;

namespace {

// n random 16-bit patterns: finite values of every exponent, infinities and NaNs included.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) x.bits = static_cast<std::uint16_t>(rng());
  return v;
}

template <class T>
void check_sum_matches_elementwise(comm_type type) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{1023},
                        std::size_t{1024}, std::size_t{1025}, std::size_t{5000}}) {
    std::vector<T> acc = random_values<T>(n, static_cast<std::uint32_t>(n) + 1);
    std::vector<T> const in = random_values<T>(n, static_cast<std::uint32_t>(n) + 7777);
    std::vector<T> expected(n);
    for (std::size_t i = 0; i < n; ++i)
      expected[i] = from_float<T>(to_float(acc[i]) + to_float(in[i]));
    reduce_into(type, reduce_op::sum, reinterpret_cast<std::byte*>(acc.data()),
                reinterpret_cast<std::byte const*>(in.data()), n * sizeof(T));
    std::size_t nan_mismatch = 0, mismatch = 0;
    for (std::size_t i = 0; i < n; ++i) {
      bool const nan = std::isnan(to_float(expected[i]));
      if (nan) {
        nan_mismatch += std::isnan(to_float(acc[i])) ? 0 : 1;
      } else {
        mismatch += acc[i].bits == expected[i].bits ? 0 : 1;
      }
    }
    INFO("n = " << n << ", ISA " << cpu::isa_name(cpu::machine_isa()));
    CHECK(nan_mismatch == 0);
    CHECK(mismatch == 0);
  }
}

}  // namespace

TEST_CASE("reduce_into sums f16 and bf16 bit-identically to the element-wise definition",
          "[comm][reduce]") {
  check_sum_matches_elementwise<half>(comm_type::f16);
  check_sum_matches_elementwise<bfloat16>(comm_type::bf16);
}

TEST_CASE("reduce_into's 16-bit sum rounds once per combination, to nearest even",
          "[comm][reduce]") {
  // 1 + 2^-11 is halfway between two halves: ties to even gives 1; 1 + 3 * 2^-11 rounds up to
  // 1 + 2^-9. 65504 + 32 overflows to infinity (the halfway point to 2^16 rounds to even: up).
  std::vector<half> acc{half(1.0f), half(1.0f), half(65504.0f), half(-0.0f)};
  std::vector<half> const in{half(0.00048828125f), half(0.00146484375f), half(32.0f), half(-0.0f)};
  reduce_into(comm_type::f16, reduce_op::sum, reinterpret_cast<std::byte*>(acc.data()),
              reinterpret_cast<std::byte const*>(in.data()), acc.size() * sizeof(half));
  CHECK(to_float(acc[0]) == 1.0f);
  CHECK(to_float(acc[1]) == 1.001953125f);
  CHECK(std::isinf(to_float(acc[2])));
  CHECK((to_float(acc[3]) == 0.0f && std::signbit(to_float(acc[3]))));
}
