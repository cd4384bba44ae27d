// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// cpu/kernels/philox.hpp: the batched generators (128 draws per group) agree with the
// element-wise `random_stream` and with each other on every ISA level the machine has.

#include <gradcomp/core/philox.hpp>
#include <gradcomp/cpu/isa.hpp>
#include <gradcomp/cpu/kernels/philox.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

namespace gc = gradcomp;
namespace kn = gradcomp::cpu::kernels;

namespace {

std::vector<gc::random_stream> test_streams() {
  return {{0, 0, 0},
          {1, 2, 3},
          {0xffffffffffffffffull, 0xffffffffu, 0xffffffffu},
          {0x243f6a8885a308d3ull, 123456u, 42u},
          {0x8000000000000000ull, 1u, 0x80000000u}};
}

std::vector<std::uint64_t> test_groups() {
  // Includes groups whose first block crosses into the high counter word (2^28 groups of 16
  // blocks = 2^32 blocks).
  return {0,
          1,
          2,
          7,
          1000,
          (1ull << 28) - 1,
          1ull << 28,
          (1ull << 28) + 1,
          0x123456789ull,
          (1ull << 57) - 1};  // the last group whose element indices fit in 64 bits
}

}  // namespace

TEST_CASE("philox kernels: scalar group fill matches random_stream", "[cpu][philox]") {
  for (auto const& rs : test_streams()) {
    for (std::uint64_t g : test_groups()) {
      kn::philox_group grp;
      kn::scalar::philox_fill(rs, g, grp);
      INFO("seed " << rs.seed << " step " << rs.step << " tensor " << rs.tensor << " group " << g);
      // Group g takes the blocks of super-group g / draw_share, both halves of each word
      // shifted by (g % draw_share) quarters of 2^16.
      std::uint32_t const shift = static_cast<std::uint32_t>(g % gc::draw_share) * 0x4000u;
      for (unsigned l = 0; l < 16; ++l) {
        gc::philox_block const b = rs.block((g / gc::draw_share) * 16 + l);
        for (unsigned w = 0; w < 4; ++w) {
          std::uint32_t const lo = ((b[w] & 0xffffu) + shift) & 0xffffu;
          std::uint32_t const hi = ((b[w] >> 16) + shift) & 0xffffu;
          REQUIRE(grp.word[w][l] == (lo | (hi << 16)));
        }
      }
      // draw(i) of the group is the draw of element group * 128 + i.
      for (unsigned i = 0; i < 128; ++i) REQUIRE(grp.draw(i) == rs.draw16(g * 128 + i));
    }
  }
}

TEST_CASE("philox kernels: AVX-512 group fill matches scalar", "[cpu][philox][simd]") {
#if GRADCOMP_X86_SIMD
  if (gc::cpu::machine_isa() < gc::cpu::isa::avx512) {
    WARN("this machine (or GRADCOMP_ISA) does not allow AVX-512; the AVX-512 generator is not run");
    return;
  }
  std::uint64_t compared = 0;
  for (auto const& rs : test_streams()) {
    for (std::uint64_t g : test_groups()) {
      kn::philox_group a, b;
      std::memset(&a, 0xAB, sizeof a);
      std::memset(&b, 0xCD, sizeof b);
      kn::scalar::philox_fill(rs, g, a);
      kn::avx512::philox_fill(rs, g, b);
      INFO("seed " << rs.seed << " step " << rs.step << " tensor " << rs.tensor << " group " << g);
      REQUIRE(std::memcmp(a.word, b.word, sizeof a.word) == 0);
      ++compared;
    }
    // A run of consecutive groups too.
    for (std::uint64_t g = 0; g < 256; ++g) {
      kn::philox_group a, b;
      kn::scalar::philox_fill(rs, g, a);
      kn::avx512::philox_fill(rs, g, b);
      REQUIRE(std::memcmp(a.word, b.word, sizeof a.word) == 0);
      ++compared;
    }
  }
  CHECK(compared == test_streams().size() * (test_groups().size() + 256));
#else
  WARN("built without the x86 SIMD kernels; nothing to compare");
#endif
}

#if GRADCOMP_X86_SIMD
namespace {

// The draws of group g from a philox_draws (which keeps the last super-group), as a group.
template <class Draws>
kn::philox_group group_from(Draws& d, std::uint64_t g);

template <>
kn::philox_group group_from(kn::avx512::philox_draws& d, std::uint64_t g) {
  kn::philox_group out;
  kn::avx512::philox16 const v = d.group(g);
  std::memcpy(out.word[0], &v.w0, 64);
  std::memcpy(out.word[1], &v.w1, 64);
  std::memcpy(out.word[2], &v.w2, 64);
  std::memcpy(out.word[3], &v.w3, 64);
  return out;
}

template <>
kn::philox_group group_from(kn::avx2::philox_draws& d, std::uint64_t g) {
  kn::philox_group out;
  kn::avx2::philox16 const v = d.group(g);
  for (unsigned w = 0; w < 4; ++w) {
    std::memcpy(out.word[w], &v.w[w][0], 32);
    std::memcpy(out.word[w] + 8, &v.w[w][1], 32);
  }
  return out;
}

template <class Draws>
void check_draws_in_any_order() {
  // In a row (each super-group generated once for its four groups), backwards, repeated and
  // jumping between super-groups: every answer is the scalar fill of that group.
  std::vector<std::uint64_t> order;
  for (std::uint64_t g = 0; g < 24; ++g) order.push_back(g);
  for (std::uint64_t g = 24; g-- > 0;) order.push_back(g);
  for (std::uint64_t g : {5ull, 5ull, 4ull, 9ull, 0ull, 3ull, 3ull, (1ull << 28) + 2, 1ull << 28,
                          (1ull << 57) - 1, (1ull << 57) - 4, 6ull}) {
    order.push_back(g);
  }
  for (auto const& rs : test_streams()) {
    Draws d(rs);
    for (std::uint64_t g : order) {
      kn::philox_group want;
      kn::scalar::philox_fill(rs, g, want);
      kn::philox_group const got = group_from(d, g);
      INFO("seed " << rs.seed << " group " << g);
      REQUIRE(std::memcmp(want.word, got.word, sizeof want.word) == 0);
    }
  }
}

}  // namespace
#endif

TEST_CASE("philox kernels: philox_draws gives each group's draws in any order", "[cpu][philox][simd]") {
#if GRADCOMP_X86_SIMD
  if (gc::cpu::machine_isa() >= gc::cpu::isa::avx2) check_draws_in_any_order<kn::avx2::philox_draws>();
  if (gc::cpu::machine_isa() >= gc::cpu::isa::avx512) {
    check_draws_in_any_order<kn::avx512::philox_draws>();
  }
  if (gc::cpu::machine_isa() < gc::cpu::isa::avx512) {
    WARN("this machine (or GRADCOMP_ISA) does not allow AVX-512; its generator is not run");
  }
#else
  WARN("built without the x86 SIMD kernels; nothing to compare");
#endif
}

TEST_CASE("isa: names and levels", "[cpu][isa]") {
  using gc::cpu::isa;
  CHECK(std::strcmp(gc::cpu::isa_name(isa::scalar), "scalar") == 0);
  CHECK(std::strcmp(gc::cpu::isa_name(isa::avx2), "avx2") == 0);
  CHECK(std::strcmp(gc::cpu::isa_name(isa::avx512), "avx512") == 0);
  CHECK(std::strcmp(gc::cpu::isa_name(isa::best), "best") == 0);
  CHECK(std::strcmp(gc::cpu::isa_name(static_cast<isa>(7)), "unknown") == 0);
  isa const m = gc::cpu::machine_isa();
  CHECK(m != isa::best);
  CHECK(gc::cpu::effective_isa(isa::best) == m);
  CHECK(gc::cpu::effective_isa(isa::scalar) == isa::scalar);
  // Never above what was asked, never above the machine.
  for (isa req : {isa::scalar, isa::avx2, isa::avx512}) {
    isa const e = gc::cpu::effective_isa(req);
    CHECK(static_cast<unsigned>(e) <= static_cast<unsigned>(req));
    CHECK(static_cast<unsigned>(e) <= static_cast<unsigned>(m));
  }
#if !GRADCOMP_X86_SIMD
  CHECK(m == isa::scalar);
#endif
}
