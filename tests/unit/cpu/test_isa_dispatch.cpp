// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The ISA tags and the dispatcher: the tag hierarchy and its fallbacks, `dispatch` mapping each
// level to its tag, overload resolution falling back to the nearest weaker level, and a kernel
// with a version at one level only (onebit_pack_pair) agreeing with its generic fallback.

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace gc = gradcomp;
namespace kn = gradcomp::cpu::kernels;
using gc::cpu::isa;

namespace {

// Tags: each level derives from, and names as fallback, the next weaker one.
static_assert(std::is_base_of_v<gc::cpu::scalar_tag, gc::cpu::avx2_tag>);
static_assert(std::is_base_of_v<gc::cpu::avx2_tag, gc::cpu::avx512_tag>);
static_assert(std::is_same_v<gc::cpu::avx512_tag::fallback, gc::cpu::avx2_tag>);
static_assert(std::is_same_v<gc::cpu::avx2_tag::fallback, gc::cpu::scalar_tag>);
static_assert(std::is_void_v<gc::cpu::scalar_tag::fallback>);
static_assert(gc::cpu::avx512_tag::level == isa::avx512);
static_assert(gc::cpu::avx2_tag::level == isa::avx2);
static_assert(gc::cpu::scalar_tag::level == isa::scalar);
static_assert(gc::cpu::is_isa_tag<gc::cpu::avx512_tag>);
static_assert(!gc::cpu::is_isa_tag<int>);

// An overload set without an AVX-512 member: the AVX-512 tag takes the AVX2 one.
int which(gc::cpu::scalar_tag) { return 0; }
int which(gc::cpu::avx2_tag) { return 1; }

bool machine_has(isa l) {
  return static_cast<unsigned>(l) <= static_cast<unsigned>(gc::cpu::machine_isa());
}

}  // namespace

TEST_CASE("ISA tags fall back to the nearest weaker level by overload resolution", "[cpu][isa]") {
  CHECK(which(gc::cpu::scalar_tag{}) == 0);
  CHECK(which(gc::cpu::avx2_tag{}) == 1);
  CHECK(which(gc::cpu::avx512_tag{}) == 1);
}

TEST_CASE("dispatch maps each level to its tag", "[cpu][isa]") {
  auto const level_of = [](isa l) {
    return gc::cpu::dispatch(l, [](auto t) { return decltype(t)::level; });
  };
  CHECK(level_of(isa::scalar) == isa::scalar);
#if GRADCOMP_X86_SIMD
  CHECK(level_of(isa::avx2) == isa::avx2);
  CHECK(level_of(isa::avx512) == isa::avx512);
#else
  CHECK(level_of(isa::avx2) == isa::scalar);
  CHECK(level_of(isa::avx512) == isa::scalar);
#endif
  CHECK(level_of(isa::best) == gc::cpu::machine_isa());
  // The result type is the callable's, references included.
  int x = 0;
  int& r = gc::cpu::dispatch(isa::scalar, [&](auto) -> int& { return x; });
  CHECK(&r == &x);
}

TEST_CASE("onebit_pack_pair agrees with two onebit_pack_block calls at every level", "[cpu][isa]") {
  constexpr std::size_t block = gc::onebit_sum_order::block;
  std::vector<float> x(2 * block);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 7 == 0 ? 1e-3f : 1.0f);
  }
  std::vector<std::byte> ref(2 * block / 8);
  double const r0 = kn::onebit_pack_block(x.data(), block, ref.data(), isa::scalar);
  double const r1 =
      kn::onebit_pack_block(x.data() + block, block, ref.data() + block / 8, isa::scalar);
  for (isa l : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!machine_has(l)) continue;
    CAPTURE(gc::cpu::isa_name(l));
    std::vector<std::byte> bits(2 * block / 8);
    double s0 = 0.0, s1 = 0.0;
    kn::onebit_pack_pair(x.data(), bits.data(), s0, s1, l);
    CHECK(bits == ref);
    CHECK(s0 == r0);
    CHECK(s1 == r1);
  }
}

TEST_CASE("onebit_pack_signs writes onebit_pack_block's bytes and finds every non-finite value",
          "[cpu][isa]") {
  float const specials[] = {std::nanf(""), INFINITY, -INFINITY, -std::nanf("")};
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                        std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{100},
                        std::size_t{4096}}) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = std::sin(0.61f * static_cast<float>(i + n)) * (i % 5 == 0 ? 1e-30f : 1.0f);
      if (i % 11 == 3) x[i] = -0.0f;
    }
    std::vector<std::byte> ref((n + 7) / 8);
    (void)kn::onebit_pack_block(x.data(), n, ref.data(), isa::scalar);
    // every position of a bad value, each kind of bad value: the flag drops at every level
    for (std::size_t bad = 0; bad <= n; ++bad) {
      std::vector<float> y = x;
      if (bad < n) y[bad] = specials[bad % 4];
      for (isa l : {isa::scalar, isa::avx2, isa::avx512}) {
        if (!machine_has(l)) continue;
        CAPTURE(n, bad, gc::cpu::isa_name(l));
        std::vector<std::byte> bits((n + 7) / 8, std::byte{0xa5});
        bool const finite = kn::onebit_pack_signs(y.data(), n, bits.data(), l);
        CHECK(finite == (bad == n));
        if (bad == n) CHECK(bits == ref);
      }
    }
  }
}
