// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Streaming stores (cpu/kernels/stream.hpp) change no byte: at every ISA level, every output
// alignment and every length, the streamed form of each kernel that has one writes exactly what
// the ordinary form writes, and nothing outside its range. The codecs choose streaming only for
// outputs of `cpu::streaming_store_min_bytes` and more; the last case runs whole codecs across
// that threshold.

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include "../support/codec_support.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace gc = gradcomp;
namespace kn = gradcomp::cpu::kernels;
using gc::cpu::isa;

namespace {

/// Every level this machine runs, scalar included.
std::vector<isa> levels() {
  std::vector<isa> v{isa::scalar};
  for (isa l : {isa::avx2, isa::avx512}) {
    if (static_cast<unsigned>(l) <= static_cast<unsigned>(gc::cpu::machine_isa())) v.push_back(l);
  }
  return v;
}

/// A zero-filled, 64-byte aligned byte buffer with guard bytes on both sides of the part a
/// kernel may write: [offset, offset + bytes) of `data()`.
class guarded {
 public:
  guarded(std::size_t offset, std::size_t bytes) : offset_(offset), bytes_(bytes) {
    std::size_t const total = (offset + bytes + 2 * 64 + 63) / 64 * 64;
    mem_.reset(static_cast<std::byte*>(std::aligned_alloc(64, total)));
    total_ = total;
    std::memset(mem_.get(), 0xA5, total);
  }
  /// Where the kernel writes: 64 + offset bytes after an aligned start.
  [[nodiscard]] std::byte* at() const noexcept { return mem_.get() + 64 + offset_; }
  [[nodiscard]] bool guards_intact() const noexcept {
    for (std::size_t i = 0; i < total_; ++i) {
      bool const inside = i >= 64 + offset_ && i < 64 + offset_ + bytes_;
      if (!inside && mem_.get()[i] != std::byte{0xA5}) return false;
    }
    return true;
  }
  [[nodiscard]] bool same_as(guarded const& o) const noexcept {
    return bytes_ == o.bytes_ && std::memcmp(at(), o.at(), bytes_) == 0;
  }

 private:
  struct free_deleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, free_deleter> mem_;
  std::size_t offset_, bytes_, total_ = 0;
};

float* floats_at(guarded const& g) { return reinterpret_cast<float*>(g.at()); }

constexpr std::size_t lengths[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4099};

}  // namespace

TEST_CASE("stream: stream_copy writes exactly the bytes of memcpy", "[cpu][stream]") {
  std::vector<std::byte> src(5000);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 37 + 11);
  for (isa l : levels()) {
    for (std::size_t bytes : {0, 1, 31, 32, 63, 64, 65, 127, 128, 129, 1000, 4096, 4999}) {
      for (std::size_t dst_off : {0, 1, 8, 31, 32, 63}) {
        for (std::size_t src_off : {0, 1}) {
          INFO("level " << gc::cpu::isa_name(l) << " bytes " << bytes << " dst offset " << dst_off
                        << " src offset " << src_off);
          guarded g(dst_off, bytes);
          kn::stream_copy(g.at(), src.data() + src_off, bytes, l);
          CHECK(std::memcmp(g.at(), src.data() + src_off, bytes) == 0);
          CHECK(g.guards_intact());
        }
      }
    }
  }
}

TEST_CASE("stream: fp16 and bf16 conversion, streamed and not, give the same bytes",
          "[cpu][stream]") {
  std::vector<float> x = gradcomp_test::gaussian(5000, 3);
  x[5] = 1e30f;    // overflows binary16
  x[40] = -0.0f;   // signed zero
  x[77] = std::numeric_limits<float>::quiet_NaN();
  for (isa l : levels()) {
    for (std::size_t n : lengths) {
      // Byte offsets of the 16-bit output: even ones can reach a line boundary, odd ones cannot.
      for (std::size_t off : {0, 1, 2, 6, 32, 34, 62}) {
        INFO("level " << gc::cpu::isa_name(l) << " n " << n << " offset " << off);
        guarded a(off, 2 * n), b(off, 2 * n), c(off, 2 * n), d(off, 2 * n);
        kn::narrow<kn::half_format::f16>(x.data(), a.at(), n, l, false);
        kn::narrow<kn::half_format::f16>(x.data(), b.at(), n, l, true);
        kn::narrow<kn::half_format::bf16>(x.data(), c.at(), n, l, false);
        kn::narrow<kn::half_format::bf16>(x.data(), d.at(), n, l, true);
        CHECK(a.same_as(b));
        CHECK(c.same_as(d));
        CHECK(b.guards_intact());
        CHECK(d.guards_intact());
        // And back to float, streamed and not (float offsets 0, 4, 60 bytes from a line).
        for (std::size_t foff : {0, 4, 60}) {
          guarded w0(foff, 4 * n), w1(foff, 4 * n);
          kn::widen<kn::half_format::f16>(b.at(), floats_at(w0), n, 1.0f, false, l, false);
          kn::widen<kn::half_format::f16>(b.at(), floats_at(w1), n, 1.0f, false, l, true);
          CHECK(w0.same_as(w1));
          CHECK(w1.guards_intact());
          kn::widen<kn::half_format::bf16>(d.at(), floats_at(w0), n, 1.0f, false, l, false);
          kn::widen<kn::half_format::bf16>(d.at(), floats_at(w1), n, 1.0f, false, l, true);
          CHECK(w0.same_as(w1));
          CHECK(w1.guards_intact());
        }
      }
    }
  }
}

TEST_CASE("stream: int8, natural and dither decoders, streamed and not, give the same floats",
          "[cpu][stream]") {
  gradcomp_test::test_rng r(91);
  std::size_t const n = 3000;
  std::size_t const blen = 100;
  std::size_t const nb = (n + blen - 1) / blen;
  std::vector<std::uint8_t> codes(n + 16);
  for (std::uint8_t& c : codes) c = static_cast<std::uint8_t>(r.below(256));
  std::vector<float> los(nb), steps(nb);
  std::vector<std::uint8_t> emax(nb);
  for (std::size_t k = 0; k < nb; ++k) {
    los[k] = -1.0f - static_cast<float>(k);
    steps[k] = 0.01f * static_cast<float>(k + 1);
  }
  // Natural codes the encoder can produce (random bytes are often not valid).
  std::vector<float> const x = gradcomp_test::gaussian(n, 5);
  for (std::size_t k = 0; k < nb; ++k) {
    std::size_t const b0 = k * blen;
    unsigned const m = kn::block_max_exponent(x.data() + b0, std::min(blen, n - b0), isa::scalar);
    emax[k] = static_cast<std::uint8_t>(std::min(m, 253u));
  }
  std::vector<std::uint8_t> ncodes(n + 16);
  gc::random_stream const rs{7, 1, 2};
  kn::natural_encode(x.data(), 0, n, blen, emax.data(), rs, ncodes.data(), isa::scalar);
  kn::dither_shape const sh{7, 4, false};
  std::vector<kn::dither_bucket> db(nb);
  std::vector<float> dsteps(nb);
  for (std::size_t k = 0; k < nb; ++k) {
    db[k] = kn::make_dither_bucket(3.0f + static_cast<float>(k), sh);
    dsteps[k] = db[k].step;
  }
  std::vector<std::byte> dcodes((n * sh.width + 7) / 8 + 32);
  kn::dither_encode(x.data(), 0, n, blen, db.data(), sh, rs, dcodes.data(), isa::scalar);

  for (isa l : levels()) {
    // [begin, end) with begin a multiple of 16 (and of 128 for the dither group path).
    for (auto [b, e] : {std::pair<std::size_t, std::size_t>{0, n}, {128, 2001}, {16, 17}, {256, 256 + 512}}) {
      for (std::size_t foff : {0, 4, 32, 60}) {
        INFO("level " << gc::cpu::isa_name(l) << " range [" << b << ", " << e << ") offset "
                      << foff);
        guarded a(foff, 4 * n), s(foff, 4 * n);
        std::memset(a.at(), 0, 4 * n);
        std::memset(s.at(), 0, 4 * n);
        kn::int8_decode(codes.data(), b, e, blen, los.data(), steps.data(), floats_at(a), 1.0f, false, l, false);
        kn::int8_decode(codes.data(), b, e, blen, los.data(), steps.data(), floats_at(s), 1.0f, false, l, true);
        CHECK(a.same_as(s));
        CHECK(s.guards_intact());
        bool const ok0 = kn::natural_decode(ncodes.data(), b, e, blen, emax.data(), floats_at(a), 1.0f, false, l, false);
        bool const ok1 = kn::natural_decode(ncodes.data(), b, e, blen, emax.data(), floats_at(s), 1.0f, false, l, true);
        CHECK(ok0);
        CHECK(ok1);
        CHECK(a.same_as(s));
        CHECK(s.guards_intact());
        bool const d0 = kn::dither_decode(dcodes.data(), b, e, blen, dsteps.data(), sh, floats_at(a), 1.0f, false, l, false);
        bool const d1 = kn::dither_decode(dcodes.data(), b, e, blen, dsteps.data(), sh, floats_at(s), 1.0f, false, l, true);
        CHECK(d0);
        CHECK(d1);
        CHECK(a.same_as(s));
        CHECK(s.guards_intact());
        // With `add`, `stream` is ignored: both accumulate.
        kn::int8_decode(codes.data(), b, e, blen, los.data(), steps.data(), floats_at(a), 0.5f, true, l, false);
        kn::int8_decode(codes.data(), b, e, blen, los.data(), steps.data(), floats_at(s), 0.5f, true, l, true);
        CHECK(a.same_as(s));
      }
    }
  }
}

TEST_CASE("stream: codecs give the same packets and values on both sides of the streaming threshold",
          "[cpu][stream][codec]") {
  // n elements of 16-bit output reach the threshold exactly: compress streams at n, not at n - 16.
  std::size_t const n = gc::cpu::streaming_store_min_bytes / 2;
  REQUIRE(gc::cpu::stream_output(2 * n));
  REQUIRE(!gc::cpu::stream_output(2 * (n - 16)));
  std::vector<float> const x = gradcomp_test::gaussian(n + 3, 11);
  gc::codec_context ctx = gradcomp_test::serial_ctx();
  char const* const specs[] = {"identity", "fp16", "bf16", "int8:bucket=512", "natural:bucket=512",
                               "qsgd:levels=7,bucket=512", "dithering:levels=8,partition=natural,norm=max,bucket=512"};
  for (char const* spec : specs) {
    INFO(spec);
    gc::any_codec const codec = gc::make_codec(spec);
    // The first m elements of a streamed call and of a call below the threshold agree, and the
    // decoded values agree with decompress_add into zeros (which never streams).
    for (std::size_t m : {n - 16, n + 3}) {
      std::span<float const> const in(x.data(), m);
      std::vector<std::byte> p(codec.max_compressed_bytes(m));
      p.resize(codec.compress(gc::tensor_view<float const>(in), p, ctx));
      std::vector<float> out(m, 7.0f), acc(m, 0.0f);
      codec.decompress(p, std::span<float>(out), ctx);
      codec.decompress_add(p, std::span<float>(acc), 1.0f, ctx);
      bool same = true;
      for (std::size_t i = 0; i < m && same; ++i) same = out[i] == acc[i];
      CHECK(same);
      if (std::string(spec) == "fp16" || std::string(spec) == "identity") {
        // Element-wise codecs: the streamed packet's payload is the prefix-independent encoding.
        std::vector<std::byte> q(codec.max_compressed_bytes(16));
        q.resize(codec.compress(gc::tensor_view<float const>(std::span<float const>(x.data() + m - 16, 16)), q, ctx));
        std::size_t const w = std::string(spec) == "fp16" ? 2 : 4;
        CHECK(std::memcmp(p.data() + p.size() - 16 * w, q.data() + q.size() - 16 * w, 16 * w) == 0);
      }
    }
  }
}
