// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: every codec's decoder through `decompress_any`, into float32, float16 and
// bfloat16 outputs, overwriting and accumulating, with an output of the packet's element count
// or one that differs from it.
//
// Input: one control byte, then the packet.
//   bits 0-1  output type: 0 f32, 1 f16, 2 bf16, 3 f32
//   bits 2-3  output size: 0, 1 the header's element count; 2 one more; 3 one fewer
//   bits 4-6  alpha of an extra accumulating decode (see `alphas`)
//
// Oracles, for a decode that succeeds:
// - the output had the header's element count (a size mismatch must be an error);
// - decoding over two different prior contents gives the same bits (every element written);
// - decoding into f16 / bf16 equals decoding into f32 rounded once;
// - accumulating with alpha = 1 equals the prior contents plus the overwriting decode;
// - acceptance does not depend on the mode or on alpha.
// With an output of the right size, the only error a decoder may raise is `format_error`.

#include "fuzz.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/core/wire.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace {

namespace gc = gradcomp;
using namespace gradcomp_fuzz;

constexpr float alphas[8] = {1.0f, -1.0f,  0.5f,  0.0f,
                             3.0f, -0.25f, 1e30f, std::numeric_limits<float>::quiet_NaN()};

template <class T>
std::vector<T> filled(std::size_t n, float v) {
  return std::vector<T>(n, gc::from_float<T>(v));
}

/// For a PowerSGD low-rank packet (an f32 accumulating decode is one GEMM with beta = 1, which
/// rounds differently from decoding and then adding): per element, (r + 2) times the sum of
/// |P(i, c) Q(j, c)|, a bound on the rounding difference in units of the f32 epsilon; not
/// finite where an overflow makes the comparison meaningless. Empty for other packets.
std::vector<double> gemm_slack(std::span<std::byte const> packet) {
  gc::packet_header const h = gc::read_header(packet);
  if (h.codec != gc::codec_id::powersgd || h.variant != 0) return {};
  std::size_t const cols = h.param0, r = h.param1, rows = static_cast<std::size_t>(h.count / cols);
  std::byte const* v = packet.data() + gc::header_bytes;
  std::vector<double> s(rows * cols, 0.0);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      double a = 0.0;
      for (std::size_t c = 0; c < r; ++c) {
        a += std::fabs(static_cast<double>(gc::detail::load_f32(v + 4 * (c * rows + i))) *
                       gc::detail::load_f32(v + 4 * (r * rows + c * cols + j)));
      }
      s[i * cols + j] = a > 0x1p120 ? HUGE_VAL : static_cast<double>(r + 2) * a;
    }
  }
  return s;
}

template <class T>
bool decode(std::span<std::byte const> packet, std::vector<T>& out, float alpha, bool add,
            bool match) {
  auto const ctx = context();
  auto const run = [&] { gc::decompress_any(packet, std::span<T>(out), alpha, add, ctx); };
  if (match)
    return accepted_only<gc::format_error>(
        run, "decoder raised a non-format error on a right-sized output");
  return accepted(run);
}

template <class T>
void check(std::span<std::byte const> packet, std::size_t n, bool match, float alpha) {
  std::vector<T> a = filled<T>(n, 0.0f);
  std::vector<T> b = filled<T>(n, -7.5f);
  bool const ok = decode(packet, a, 1.0f, false, match);
  GRADCOMP_FUZZ_CHECK(ok == decode(packet, b, 1.0f, false, match),
                      "acceptance depends on the output's prior contents");
  std::vector<float> base = sample_tensor(n);
  std::vector<T> acc(n);
  for (std::size_t i = 0; i < n; ++i) acc[i] = gc::from_float<T>(base[i]);
  std::vector<T> scaled = acc;
  bool const add_ok = decode(packet, acc, 1.0f, true, match);
  GRADCOMP_FUZZ_CHECK(ok == add_ok, "overwriting and accumulating decodes disagree on acceptance");
  GRADCOMP_FUZZ_CHECK(ok == decode(packet, scaled, alpha, true, match),
                      "acceptance depends on alpha");
  if (!ok) return;
  GRADCOMP_FUZZ_CHECK(match,
                      "decoded into an output whose size differs from the header's element count");
  for (std::size_t i = 0; i < n; ++i) {
    GRADCOMP_FUZZ_CHECK(bits_of(a[i]) == bits_of(b[i]),
                        "an element was left unwritten (or the decode is not deterministic)");
  }
  std::vector<float> f(n);
  if constexpr (std::is_same_v<T, float>) {
    f = a;
  } else {
    GRADCOMP_FUZZ_CHECK(decode(packet, f, 1.0f, false, match),
                        "decodes into f16/bf16 but not into f32");
    for (std::size_t i = 0; i < n; ++i) {
      GRADCOMP_FUZZ_CHECK(same_value(gc::to_float(a[i]), gc::to_float(gc::from_float<T>(f[i]))),
                          "a 16-bit decode differs from the f32 decode rounded once");
    }
  }
  std::vector<double> const slack =
      std::is_same_v<T, float> ? gemm_slack(packet) : std::vector<double>{};
  for (std::size_t i = 0; i < n; ++i) {
    float const want =
        gc::to_float(gc::from_float<T>(gc::to_float(gc::from_float<T>(base[i])) + f[i]));
    float const got = gc::to_float(acc[i]);
    if (slack.empty()) {
      GRADCOMP_FUZZ_CHECK(same_value(got, want), "accumulating decode differs from prior + decode");
    } else if (std::isfinite(slack[i])) {
      double const tol = 0x1p-21 * (std::fabs(base[i]) + slack[i]) + 0x1p-140;
      GRADCOMP_FUZZ_CHECK(std::fabs(static_cast<double>(got) - want) <= tol,
                          "accumulating PowerSGD decode is off by more than GEMM rounding");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  input in(data, size);
  std::uint8_t const control = in.u8();
  std::span<std::byte const> const packet = in.rest();
  std::uint64_t count = 0;
  if (packet.size() >= 16) count = gc::detail::load_le<std::uint64_t>(packet.data() + 8);
  unsigned const sizing = (control >> 2) & 3u;
  bool const match = sizing < 2;
  std::size_t n = 0;
  if (match) {
    if (count > max_elements) return 0;  // harness cap, not a library limit
    n = static_cast<std::size_t>(count);
  } else if (count >= max_elements) {
    n = 3;
  } else {
    n = sizing == 2 ? static_cast<std::size_t>(count) + 1
                    : (count == 0 ? 1 : static_cast<std::size_t>(count) - 1);
  }
  float const alpha = alphas[(control >> 4) & 7u];
  switch (control & 3u) {
    case 1: check<gc::half>(packet, n, match, alpha); break;
    case 2: check<gc::bfloat16>(packet, n, match, alpha); break;
    default: check<float>(packet, n, match, alpha); break;
  }
  return 0;
}
