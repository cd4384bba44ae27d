// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Every SIMD level of the CPU kernels (AVX2, AVX-512) agrees bit for bit with the scalar
// reference: Philox draws, block norms and ranges, dither / int8 / natural codes, decoded floats
// and validation verdicts, directly and through whole codecs. Levels the machine (or
// GRADCOMP_ISA) does not allow are skipped.

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gc = gradcomp;
namespace kn = gradcomp::cpu::kernels;
using gc::cpu::isa;

namespace {

/// The SIMD levels this machine runs, to compare with scalar.
std::vector<isa> simd_levels() {
  std::vector<isa> v;
  for (isa l : {isa::avx2, isa::avx512}) {
    if (static_cast<unsigned>(l) <= static_cast<unsigned>(gc::cpu::machine_isa())) v.push_back(l);
  }
  return v;
}

bool skip_without_simd() {
  if (simd_levels().empty()) {
    WARN("this machine (or GRADCOMP_ISA) allows no SIMD level; nothing to compare");
    return true;
  }
  return false;
}

/// SplitMix64 test data (independent of the library's Philox), shared with the codec tests.
using rng = gradcomp_test::test_rng;

/// Input families, the adversarial ones included. `nonfinite` is last: the others are finite.
enum class family {
  gaussian,
  heavy,
  zeros,
  signed_zeros,
  subnormal,
  huge,
  half_integers,
  constant,
  wide,
  sparse,
  positive,
  negative,
  tiny,
  nonfinite,
};
constexpr int family_count = 14;
constexpr int finite_family_count = 13;

char const* family_name(family f) {
  static char const* const names[] = {
      "gaussian", "heavy", "zeros",  "signed_zeros", "subnormal", "huge", "half_int",
      "constant", "wide",  "sparse", "positive",     "negative",  "tiny", "nonfinite"};
  return names[static_cast<int>(f)];
}

std::vector<float> make_input(family f, std::size_t n, std::uint64_t seed) {
  rng r(seed * 7919 + static_cast<std::uint64_t>(f));
  std::vector<float> x(n);
  for (float& v : x) {
    switch (f) {
      case family::gaussian: v = static_cast<float>(r.gaussian()); break;
      case family::heavy:
        v = static_cast<float>(r.gaussian() * std::exp(2.0 * r.gaussian()) * 1e-3);
        break;
      case family::zeros: v = 0.0f; break;
      case family::signed_zeros: {
        std::uint32_t const c = r.below(4);
        v = c == 0   ? 0.0f
            : c == 1 ? -0.0f
                     : static_cast<float>(c == 2 ? r.uniform() : -r.uniform());
        break;
      }
      case family::subnormal:
        v = std::bit_cast<float>(r.below(0x800000) | (r.below(2) << 31));
        break;
      case family::huge: v = static_cast<float>((2.0 * r.uniform() - 1.0) * 3.0e38); break;
      case family::half_integers: v = static_cast<float>(r.below(512)) * 0.5f - 64.0f; break;
      case family::constant: v = 0.1f; break;
      case family::wide:
        v = static_cast<float>(std::ldexp(r.gaussian(), static_cast<int>(r.below(250)) - 140));
        break;
      case family::sparse:
        v = r.below(50) == 0 ? static_cast<float>(r.gaussian()) : (r.below(2) ? 0.0f : -0.0f);
        break;
      case family::positive:
        v = r.below(8) == 0 ? (r.below(2) ? 0.0f : -0.0f) : static_cast<float>(r.uniform());
        break;
      case family::negative:
        v = r.below(8) == 0 ? (r.below(2) ? 0.0f : -0.0f) : -static_cast<float>(r.uniform());
        break;
      case family::tiny: v = static_cast<float>(r.gaussian() * 1e-25); break;
      case family::nonfinite: {
        std::uint32_t const c = r.below(1000);
        v = c == 0   ? NAN
            : c == 1 ? INFINITY
            : c == 2 ? -INFINITY
                     : static_cast<float>(r.gaussian());
        break;
      }
    }
  }
  if (f == family::nonfinite && n > 0) x[r.below(n)] = (seed & 1) ? NAN : INFINITY;
  return x;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}
bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}
bool same_floats(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

/// Some [begin, end) subranges of [0, n) with begin a multiple of `align`, plus [0, n).
std::vector<std::pair<std::size_t, std::size_t>> ranges(std::size_t n, std::size_t align, rng& r) {
  std::vector<std::pair<std::size_t, std::size_t>> v{{0, n}};
  for (int q = 0; q < 2 && n > 0; ++q) {
    std::size_t const b = r.below(n) / align * align;
    v.emplace_back(b, std::min(n, b + align * (1 + r.below(256 / align + 4))));
  }
  return v;
}

}  // namespace

TEST_CASE("isa agreement: AVX2 and AVX-512 Philox groups match scalar", "[cpu][isa][philox]") {
#if GRADCOMP_X86_SIMD
  if (skip_without_simd()) return;
  gc::random_stream const streams[] = {{0, 0, 0},
                                       {1, 2, 3},
                                       {~0ull, ~0u, ~0u},
                                       {0x243f6a8885a308d3ull, 123456u, 42u},
                                       {0x8000000000000000ull, 1u, 0x80000000u}};
  std::vector<std::uint64_t> groups{(1ull << 28) - 1, 1ull << 28, (1ull << 28) + 1, 0x123456789ull,
                                    (1ull << 57) - 1};
  for (std::uint64_t g = 0; g < 300; ++g) groups.push_back(g);
  bool const has512 = gc::cpu::machine_isa() == isa::avx512;
  for (auto const& rs : streams) {
    for (std::uint64_t g : groups) {
      INFO("seed " << rs.seed << " step " << rs.step << " tensor " << rs.tensor << " group " << g);
      kn::philox_group ref, a2, a5;
      std::memset(&ref, 0x11, sizeof ref);
      std::memset(&a2, 0x22, sizeof a2);
      std::memset(&a5, 0x33, sizeof a5);
      kn::scalar::philox_fill(rs, g, ref);
      kn::avx2::philox_fill(rs, g, a2);
      REQUIRE(std::memcmp(ref.word, a2.word, sizeof ref.word) == 0);
      if (has512) {
        kn::avx512::philox_fill(rs, g, a5);
        REQUIRE(std::memcmp(ref.word, a5.word, sizeof ref.word) == 0);
      }
    }
  }
#else
  WARN("built without the x86 SIMD kernels; nothing to compare");
#endif
}

TEST_CASE("isa agreement: four block sums of squares at once match four scalar ones", "[cpu][isa]") {
  if (skip_without_simd()) return;
  for (std::size_t n : {1u, 15u, 16u, 17u, 100u, 512u, 513u, 4096u}) {
    for (std::size_t stride : {n, n + 3}) {
      for (int fi = 0; fi < family_count; ++fi) {
        family const f = static_cast<family>(fi);
        std::vector<float> const buf = make_input(f, 4 * stride + 1, n * 7 + stride + static_cast<std::size_t>(fi));
        for (std::size_t off = 0; off < 2; ++off) {
          float const* x = buf.data() + off;
          INFO("n " << n << " stride " << stride << " offset " << off << " family " << family_name(f));
          for (isa l : simd_levels()) {
            INFO("level " << gc::cpu::isa_name(l));
            double got[4];
            kn::block_sumsq4(x, stride, n, got, l);
            for (std::size_t j = 0; j < 4; ++j) {
              double const want = kn::block_sumsq(x + j * stride, n, isa::scalar);
              CHECK((same_bits(got[j], want) || (std::isnan(got[j]) && std::isnan(want))));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("isa agreement: block norms, ranges and exponents match scalar", "[cpu][isa]") {
  if (skip_without_simd()) return;
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 140; ++n) sizes.push_back(n);
  for (std::size_t n : {255u, 256u, 257u, 1000u, 4095u, 4096u, 10001u}) sizes.push_back(n);
  for (std::size_t n : sizes) {
    for (int fi = 0; fi < family_count; ++fi) {
      family const f = static_cast<family>(fi);
      std::vector<float> const buf = make_input(f, n + 1, n * 131 + static_cast<std::size_t>(fi));
      for (std::size_t off = 0; off < 2; ++off) {  // unaligned starts too
        float const* x = buf.data() + off;
        INFO("n " << n << " offset " << off << " family " << family_name(f));
        double const s0 = kn::block_sumsq(x, std::min<std::size_t>(n, kn::norm_block), isa::scalar);
        float const a0 = kn::block_absmax(x, std::min<std::size_t>(n, kn::norm_block), isa::scalar);
        unsigned const e0 = kn::block_max_exponent(x, n, isa::scalar);
        for (isa l : simd_levels()) {
          INFO("level " << gc::cpu::isa_name(l));
          double const s = kn::block_sumsq(x, std::min<std::size_t>(n, kn::norm_block), l);
          CHECK((same_bits(s, s0) || (std::isnan(s) && std::isnan(s0))));
          float const a = kn::block_absmax(x, std::min<std::size_t>(n, kn::norm_block), l);
          CHECK((same_bits(a, a0) || (std::isnan(a) && std::isnan(a0))));
          CHECK(kn::block_max_exponent(x, n, l) == e0);
          // The codec starts from x[0]; other starting values (signed zeros, NaN) too.
          for (float init : {n ? x[0] : 0.0f, 0.0f, -0.0f, 1.0f, -1.0f, NAN}) {
            float lo0 = init, hi0 = init, lo = init, hi = init;
            bool const ok0 = kn::block_minmax(x, n, lo0, hi0, isa::scalar);
            bool const ok = kn::block_minmax(x, n, lo, hi, l);
            INFO("init " << init);
            CHECK(ok == ok0);
            CHECK(same_bits(lo, lo0));
            CHECK(same_bits(hi, hi0));
          }
        }
      }
    }
  }
  // A non-finite element is reported whatever its position.
  for (std::size_t n : {1u, 15u, 16u, 17u, 40u}) {
    for (std::size_t at = 0; at < n; ++at) {
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        std::vector<float> x(n, 0.5f);
        x[at] = bad;
        for (isa l : simd_levels()) {
          float lo = x[0], hi = x[0];
          CHECK_FALSE(kn::block_minmax(x.data(), n, lo, hi, l));
          CHECK(std::isnan(kn::block_absmax(x.data(), n, l)));
          CHECK(kn::block_max_exponent(x.data(), n, l) == 255u);
        }
      }
    }
  }
}

TEST_CASE("isa agreement: dither codes and decoded values match scalar", "[cpu][isa][dither]") {
  if (skip_without_simd()) return;
  rng r(2024);
  std::vector<kn::dither_shape> shapes;
  for (std::uint32_t s = 1; s <= 30; ++s)
    shapes.push_back({s, 1u + static_cast<unsigned>(std::bit_width(s)), true});
  for (unsigned w = 2; w <= 16; ++w) {  // every code width, at its smallest and largest s
    for (std::uint32_t s : {1u << (w - 2), (1u << (w - 1)) - 1u}) {
      shapes.push_back({s, w, false});
    }
  }
  for (kn::dither_shape const& sh : shapes) {
    for (int rep = 0; rep < 6; ++rep) {
      std::size_t const n = rep == 0 ? r.below(40) : rep < 4 ? r.below(1100) : 1000 + r.below(5000);
      std::size_t const lens[] = {1, 15, 16, 33, 100, 512, n == 0 ? 1 : n, 1 + r.below(600)};
      std::size_t const blen = lens[r.below(8)];
      family const f = static_cast<family>(r.below(finite_family_count));
      std::vector<float> const x = make_input(f, n, r.next());
      std::size_t const nb = n == 0 ? 0 : (n + blen - 1) / blen;
      std::vector<kn::dither_bucket> buckets(nb);
      std::vector<float> steps(nb);
      for (std::size_t k = 0; k < nb; ++k) {
        std::size_t const b = k * blen;
        std::size_t const e = std::min(n, b + blen);
        float scale = 0.0f;
        for (std::size_t i = b; i < e; i += kn::norm_block) {
          scale = std::max(
              scale, kn::block_absmax(x.data() + i, std::min(kn::norm_block, e - i), isa::scalar));
        }
        switch (r.below(4)) {
          case 0: scale = 0.0f; break;
          case 1: scale *= 0.3f; break;  // too small: codes clamp at s
          default: break;
        }
        buckets[k] = kn::make_dither_bucket(scale, sh);
        steps[k] = buckets[k].step;
      }
      gc::random_stream const rs{r.next(), r.below(1000), r.below(64)};
      INFO("s " << sh.s << " width " << sh.width << " natural " << sh.natural << " n " << n
                << " bucket " << blen << " family " << family_name(f));
      // Encode: bytes outside the range must stay as they were, so start from garbage.
      std::size_t const bytes = (n * sh.width + 7) / 8 + 32;
      std::vector<std::byte> garbage(bytes);
      for (std::byte& b : garbage) b = static_cast<std::byte>(r.below(256));
      for (auto [b, e] : ranges(n, 128, r)) {
        INFO("range [" << b << ", " << e << ")");
        std::vector<std::byte> ref = garbage;
        kn::dither_encode(x.data(), b, e, blen, buckets.data(), sh, rs, ref.data(), isa::scalar);
        for (isa l : simd_levels()) {
          INFO("level " << gc::cpu::isa_name(l));
          std::vector<std::byte> got = garbage;
          kn::dither_encode(x.data(), b, e, blen, buckets.data(), sh, rs, got.data(), l);
          CHECK(got == ref);
        }
      }
      // Decode: the encoded stream, one with flipped bits, and random codes.
      std::vector<std::byte> codes(bytes);
      kn::dither_encode(x.data(), 0, n, blen, buckets.data(), sh, rs, codes.data(), isa::scalar);
      std::vector<float> const base = make_input(family::gaussian, n, r.next());
      for (int variant = 0; variant < 3; ++variant) {
        std::vector<std::byte> c = codes;
        if (variant == 1 && n > 0) {
          for (int k = 0; k < 3; ++k) {
            std::size_t const bit = r.below(n * sh.width);
            c[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
          }
        } else if (variant == 2) {
          for (std::size_t i = 0; i < n * sh.width / 8; ++i)
            c[i] = static_cast<std::byte>(r.below(256));
        }
        for (auto [b, e] : ranges(n, 16, r)) {
          for (bool add : {false, true}) {
            INFO("codes " << variant << " range [" << b << ", " << e << ") add " << add);
            std::vector<float> ref = base;
            bool const ok0 = kn::dither_decode(c.data(), b, e, blen, steps.data(), sh, ref.data(),
                                               -0.75f, add, isa::scalar);
            if (variant == 0) CHECK(ok0);
            for (isa l : simd_levels()) {
              INFO("level " << gc::cpu::isa_name(l));
              std::vector<float> got = base;
              bool const ok = kn::dither_decode(c.data(), b, e, blen, steps.data(), sh, got.data(),
                                                -0.75f, add, l);
              CHECK(ok == ok0);
              if (ok && ok0) CHECK(same_floats(got, ref));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("isa agreement: int8 and natural codes and decoded values match scalar",
          "[cpu][isa][bytecode]") {
  if (skip_without_simd()) return;
  rng r(77);
  for (int rep = 0; rep < 300; ++rep) {
    std::size_t const n = rep < 50 ? r.below(40) : rep < 250 ? r.below(1500) : r.below(20000);
    std::size_t const lens[] = {1, 15, 16, 33, 100, 512, n == 0 ? 1 : n, 1 + r.below(300)};
    std::size_t const blen = lens[rep % 8];
    family const f = static_cast<family>(r.below(finite_family_count));
    std::vector<float> const x = make_input(f, n, r.next());
    std::size_t const nb = n == 0 ? 0 : (n + blen - 1) / blen;
    std::vector<kn::int8_bucket> ib(nb);
    std::vector<float> los(nb), steps(nb);
    std::vector<std::uint8_t> emax(nb);
    for (std::size_t k = 0; k < nb; ++k) {
      std::size_t const b = k * blen;
      std::size_t const e = std::min(n, b + blen);
      float lo = x[b], hi = x[b];
      kn::block_minmax(x.data() + b, e - b, lo, hi, isa::scalar);
      if (r.below(8) == 0) {  // a range so narrow that 255 / (hi - lo) overflows float
        float const t = std::bit_cast<float>(r.below(0x800000));
        lo = -t;
        hi = t;
      }
      ib[k] = kn::make_int8_bucket(lo, hi);
      los[k] = lo;
      steps[k] = kn::int8_step(lo, hi);
      unsigned const m = kn::block_max_exponent(x.data() + b, e - b, isa::scalar);
      emax[k] = static_cast<std::uint8_t>(std::min(m, 253u));
    }
    gc::random_stream const rs{r.next(), r.below(100), r.below(100)};
    INFO("n " << n << " bucket " << blen << " family " << family_name(f));
    for (auto [b, e] : ranges(n, 128, r)) {
      INFO("range [" << b << ", " << e << ")");
      for (bool stochastic : {false, true}) {
        std::vector<std::uint8_t> ref(n + 16, 0x5a);
        kn::int8_encode(x.data(), b, e, blen, ib.data(), stochastic, rs, ref.data(), isa::scalar);
        for (isa l : simd_levels()) {
          INFO("int8 stochastic " << stochastic << " level " << gc::cpu::isa_name(l));
          std::vector<std::uint8_t> got(n + 16, 0x5a);
          kn::int8_encode(x.data(), b, e, blen, ib.data(), stochastic, rs, got.data(), l);
          CHECK(got == ref);
        }
      }
      std::vector<std::uint8_t> ref(n + 16, 0x5a);
      kn::natural_encode(x.data(), b, e, blen, emax.data(), rs, ref.data(), isa::scalar);
      for (isa l : simd_levels()) {
        INFO("natural level " << gc::cpu::isa_name(l));
        std::vector<std::uint8_t> got(n + 16, 0x5a);
        kn::natural_encode(x.data(), b, e, blen, emax.data(), rs, got.data(), l);
        CHECK(got == ref);
      }
    }
    // Decode random bytes (every int8 byte is valid; many natural ones are not) and real codes.
    std::vector<std::uint8_t> random_bytes(n + 16);
    for (std::uint8_t& v : random_bytes) v = static_cast<std::uint8_t>(r.below(256));
    std::vector<std::uint8_t> natural_codes(n + 16);
    kn::natural_encode(x.data(), 0, n, blen, emax.data(), rs, natural_codes.data(), isa::scalar);
    std::vector<float> const base = make_input(family::gaussian, n, r.next());
    for (auto [b, e] : ranges(n, 16, r)) {
      for (bool add : {false, true}) {
        INFO("decode range [" << b << ", " << e << ") add " << add);
        std::vector<float> ref = base;
        kn::int8_decode(random_bytes.data(), b, e, blen, los.data(), steps.data(), ref.data(),
                        1.25f, add, isa::scalar);
        for (isa l : simd_levels()) {
          std::vector<float> got = base;
          kn::int8_decode(random_bytes.data(), b, e, blen, los.data(), steps.data(), got.data(),
                          1.25f, add, l);
          CHECK(same_floats(got, ref));
        }
        for (auto const* c : {&random_bytes, &natural_codes}) {
          std::vector<float> nref = base;
          bool const ok0 = kn::natural_decode(c->data(), b, e, blen, emax.data(), nref.data(),
                                              1.25f, add, isa::scalar);
          if (c == &natural_codes) CHECK(ok0);
          for (isa l : simd_levels()) {
            INFO("natural decode level " << gc::cpu::isa_name(l));
            std::vector<float> got = base;
            bool const ok =
                kn::natural_decode(c->data(), b, e, blen, emax.data(), got.data(), 1.25f, add, l);
            CHECK(ok == ok0);
            if (ok && ok0) CHECK(same_floats(got, nref));
          }
        }
      }
    }
  }
}

namespace {

struct outcome {
  bool threw = false;
  std::string what;
  std::vector<std::byte> bytes;
  bool operator==(outcome const&) const = default;
};

gc::codec_context at_level(isa l, std::uint64_t seed) {
  gc::codec_context c;
  c.seed = seed;
  c.step = static_cast<std::uint32_t>(seed % 89);
  c.isa = l;
  c.parallel_threshold = SIZE_MAX;  // chunking does not depend on threads; keep it serial
  return c;
}

outcome compress_at(gc::any_codec const& c, std::vector<float> const& x,
                    gc::codec_context const& ctx) {
  outcome o;
  std::vector<std::byte> buf(c.max_compressed_bytes(x.size()));
  try {
    buf.resize(c.compress(gc::tensor_view<float const>(std::span<float const>(x), gc::tensor_id{3}),
                          std::span<std::byte>(buf), ctx));
    o.bytes = std::move(buf);
  } catch (gc::error const& e) {
    o.threw = true;
    o.what = e.what();
  }
  return o;
}

outcome decompress_at(gc::any_codec const& c, std::vector<std::byte> const& packet,
                      std::vector<float> out, float alpha, bool add, gc::codec_context const& ctx) {
  outcome o;
  try {
    if (add) {
      c.decompress_add(std::span<std::byte const>(packet), std::span<float>(out), alpha, ctx);
    } else {
      c.decompress(std::span<std::byte const>(packet), std::span<float>(out), ctx);
    }
    o.bytes.resize(4 * out.size());
    if (!out.empty()) std::memcpy(o.bytes.data(), out.data(), 4 * out.size());
  } catch (gc::error const& e) {
    o.threw = true;
    o.what = e.what();
  }
  return o;
}

}  // namespace

TEST_CASE("isa agreement: codec packets and decoded tensors match scalar", "[cpu][isa][codec]") {
  if (skip_without_simd()) return;
  std::vector<std::string> kinds{"int8", "int8:rounding=stochastic", "natural", "terngrad"};
  for (int s : {1, 7, 127, 32767}) kinds.push_back("qsgd:levels=" + std::to_string(s));
  for (char const* norm : {"max", "l2"}) {
    for (int s : {1, 2, 3, 7, 16, 30}) {
      kinds.push_back(std::string("dithering:partition=natural,norm=") + norm +
                      ",levels=" + std::to_string(s));
    }
    for (int s : {2, 5, 255, 4096, 32767}) {
      kinds.push_back(std::string("dithering:partition=linear,norm=") + norm +
                      ",levels=" + std::to_string(s));
    }
  }
  std::size_t const sizes[] = {0, 1, 15, 16, 17, 127, 129, 300, 1000, 4097, 70001};
  std::uint32_t const bucket_lens[] = {1, 15, 16, 33, 100, 512, 0};
  rng r(5);
  for (std::string const& kind : kinds) {
    for (std::uint32_t bucket : bucket_lens) {
      std::string const spec = kind + (kind.find(':') == std::string::npos ? ":" : ",") +
                               "bucket=" + std::to_string(bucket);
      gc::any_codec const codec = gc::make_codec(spec);
      for (std::size_t n : sizes) {
        // Small tensors get every family, larger ones a few drawn at random; the largest size
        // (several chunks and norm blocks) runs with a few bucket lengths only.
        if (n > 5000 && bucket != 16 && bucket != 100 && bucket != 0) continue;
        int const families = n > 5000 ? 1 : n > 300 ? 3 : family_count;
        for (int fi = 0; fi < families; ++fi) {
          family const f =
              n > 300 ? static_cast<family>(r.below(family_count)) : static_cast<family>(fi);
          std::uint64_t const seed = r.next();
          std::vector<float> const x = make_input(f, n, seed);
          INFO(spec << " n " << n << " family " << family_name(f));
          outcome const ref = compress_at(codec, x, at_level(isa::scalar, seed));
          for (isa l : simd_levels()) {
            INFO("compress at " << gc::cpu::isa_name(l));
            CHECK(compress_at(codec, x, at_level(l, seed)) == ref);
          }
          if (ref.threw) continue;
          std::vector<std::vector<std::byte>> packets{ref.bytes};
          if (ref.bytes.size() > gc::header_bytes) {  // and a copy with a few flipped payload bits
            std::vector<std::byte> bad = ref.bytes;
            for (int k = 0; k < 3; ++k) {
              std::size_t const at = gc::header_bytes + r.below(bad.size() - gc::header_bytes);
              bad[at] ^= static_cast<std::byte>(1u << r.below(8));
            }
            packets.push_back(std::move(bad));
          }
          std::vector<float> const base = make_input(family::gaussian, n, seed + 1);
          for (std::size_t p = 0; p < packets.size(); ++p) {
            for (bool add : {false, true}) {
              outcome const d0 =
                  decompress_at(codec, packets[p], base, -0.625f, add, at_level(isa::scalar, seed));
              if (p == 0) CHECK_FALSE(d0.threw);
              for (isa l : simd_levels()) {
                INFO("decompress at " << gc::cpu::isa_name(l) << " packet " << p << " add " << add);
                CHECK(decompress_at(codec, packets[p], base, -0.625f, add, at_level(l, seed)) ==
                      d0);
              }
            }
          }
        }
      }
    }
  }
}
