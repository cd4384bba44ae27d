// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: `recompress_sparse` (and `max_recompressed_bytes`, `sparse_packet_support`) on
// any packet.
//
// Input: k (u16, little-endian), one control byte, then the packet.
//   control bits 0-1  output buffer: 0, 1 max_recompressed_bytes; 2 one byte less; 3 16 bytes
//
// Oracles, for a re-compression that succeeds:
// - the result fits the buffer and max_recompressed_bytes, and is a packet of the same codec,
//   element count and value type with min(k, m) elements;
// - its support is a subset of the packet's, and (unscaled packets) it decodes to the packet's
//   values there and to zero elsewhere;
// - re-compressing the result to k again returns it unchanged.

#include "fuzz.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/core/wire.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace {

namespace gc = gradcomp;
using namespace gradcomp_fuzz;

std::vector<float> decoded(std::span<std::byte const> packet, std::size_t n) {
  std::vector<float> out(n);
  gc::decompress_any(packet, std::span<float>(out), 1.0f, false, context());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  input in(data, size);
  std::uint64_t const k = in.u16();
  std::uint8_t const control = in.u8();
  std::span<std::byte const> const packet = in.rest();
  auto const ctx = context();

  std::optional<std::vector<std::uint32_t>> support;
  (void)accepted([&] { support = gc::sparse_packet_support(packet, ctx); });

  std::size_t bound = 0;
  if (!accepted([&] { bound = gc::max_recompressed_bytes(packet, k); })) {
    std::vector<std::byte> out(64);
    GRADCOMP_FUZZ_CHECK(
        !accepted([&] { (void)gc::recompress_sparse(packet, k, std::span<std::byte>(out), ctx); }),
        "recompress_sparse accepts a packet max_recompressed_bytes rejects");
    return 0;
  }
  GRADCOMP_FUZZ_CHECK(bound <= gc::header_bytes + 4 + std::max<std::uint64_t>(packet.size(), k * 8),
                      "max_recompressed_bytes is larger than the request can need");
  std::size_t const cap = (control & 3u) == 2   ? (bound == 0 ? 0 : bound - 1)
                          : (control & 3u) == 3 ? 16
                                                : bound;
  std::vector<std::byte> out(cap);
  std::size_t written = 0;
  if (!accepted(
          [&] { written = gc::recompress_sparse(packet, k, std::span<std::byte>(out), ctx); }))
    return 0;
  GRADCOMP_FUZZ_CHECK(written <= out.size() && written <= bound, "the result overruns its bound");
  std::span<std::byte const> const result(out.data(), written);

  gc::packet_header const h = gc::read_header(packet);
  gc::packet_header r{};
  GRADCOMP_FUZZ_CHECK(accepted([&] { r = gc::read_header(result); }),
                      "the result's header does not read back");
  GRADCOMP_FUZZ_CHECK(
      r.codec == h.codec && r.count == h.count && r.type == h.type &&
          (r.variant & 3u) == (h.variant & 3u) && r.param0 == std::min<std::uint64_t>(k, h.param0),
      "the result changed codec, count or value type, or keeps the wrong number of elements");

  std::optional<std::vector<std::uint32_t>> kept;
  GRADCOMP_FUZZ_CHECK(
      accepted([&] { kept = gc::sparse_packet_support(result, ctx); }) && kept && support,
      "the support of the packet or of the result does not read");
  GRADCOMP_FUZZ_CHECK(std::includes(support->begin(), support->end(), kept->begin(), kept->end()),
                      "the result keeps a coordinate the packet does not have");

  std::vector<std::byte> again(written);
  std::size_t again_bytes = 0;
  GRADCOMP_FUZZ_CHECK(accepted([&] {
                        again_bytes =
                            gc::recompress_sparse(result, k, std::span<std::byte>(again), ctx);
                      }),
                      "re-compressing the result fails");
  GRADCOMP_FUZZ_CHECK(
      again_bytes == written && std::equal(again.begin(), again.end(), result.begin()),
      "re-compressing the result to the same k changes it");

  if (h.count > max_elements) return 0;
  auto const n = static_cast<std::size_t>(h.count);
  std::vector<float> before, after;
  GRADCOMP_FUZZ_CHECK(accepted([&] { after = decoded(result, n); }), "the result does not decode");
  if (!accepted([&] { before = decoded(packet, n); })) {
    GRADCOMP_FUZZ_CHECK(false, "a packet recompress_sparse accepts does not decode");
  }
  bool const scaled = h.codec == gc::codec_id::random_k && (h.variant & 4u) != 0 && k < h.param0;
  std::size_t j = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bool const in_kept = j < kept->size() && (*kept)[j] == i;
    if (in_kept) ++j;
    if (!in_kept) {
      GRADCOMP_FUZZ_CHECK(after[i] == 0.0f, "the result is non-zero outside its support");
    } else if (!scaled) {
      // (same_value: re-encoding quiets a signalling NaN, as every 16-bit conversion does)
      GRADCOMP_FUZZ_CHECK(same_value(after[i], before[i]), "a kept value changed");
    }
  }
  return 0;
}
