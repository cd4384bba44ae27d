// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// A user's first program, built by each consumer project in tests/package: compress a gradient
// to fp16 and back. The inputs are exactly representable in fp16, so the round trip must return
// them bit for bit, in half the bytes plus a header.

#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <span>
#include <vector>

#if defined(GRADCOMP_EXPECTED_MAJOR)
static_assert(GRADCOMP_VERSION_MAJOR == GRADCOMP_EXPECTED_MAJOR &&
                  GRADCOMP_VERSION_MINOR == GRADCOMP_EXPECTED_MINOR &&
                  GRADCOMP_VERSION_PATCH == GRADCOMP_EXPECTED_PATCH,
              "the gradcomp headers found are not the version under test");
#endif

int main() {
  std::vector<float> grad(4096);
  for (std::size_t i = 0; i < grad.size(); ++i) {
    // Small integers scaled by powers of two: all exact in fp16.
    grad[i] = std::ldexp(static_cast<float>(static_cast<int>(i % 97) - 48),
                         -static_cast<int>(i % 9));
  }

  gradcomp::fp16_codec const codec;
  std::vector<std::byte> packet(codec.max_compressed_bytes(grad.size()));
  std::size_t const bytes =
      codec.compress(gradcomp::tensor_view<float const>(grad, gradcomp::tensor_id{3}), packet);
  if (bytes > packet.size() || bytes >= grad.size() * sizeof(float)) {
    std::fprintf(stderr, "fp16 packet of %zu bytes for %zu floats\n", bytes, grad.size());
    return 1;
  }

  std::vector<float> out(grad.size(), -1.0f);
  codec.decompress(std::span<std::byte const>(packet).first(bytes), std::span<float>(out));
  for (std::size_t i = 0; i < grad.size(); ++i) {
    if (out[i] != grad[i]) {
      std::fprintf(stderr, "element %zu: sent %g, received %g\n", i, grad[i], out[i]);
      return 1;
    }
  }
  std::printf("gradcomp %d.%d.%d: %zu floats -> %zu bytes -> exact round trip\n",
              GRADCOMP_VERSION_MAJOR, GRADCOMP_VERSION_MINOR, GRADCOMP_VERSION_PATCH, grad.size(),
              bytes);
  return 0;
}
