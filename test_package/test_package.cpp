// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// Conan test_package: an fp16 round trip of exactly representable values through the packaged
// headers.

#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <cstdio>
#include <span>
#include <vector>

int main() {
  std::vector<float> grad{0.5f, -1.0f, 2.0f, 0.25f, -8.0f, 3.0f, 0.0f, 1.5f};
  gradcomp::fp16_codec const codec;
  std::vector<std::byte> packet(codec.max_compressed_bytes(grad.size()));
  std::size_t const bytes =
      codec.compress(gradcomp::tensor_view<float const>(grad, gradcomp::tensor_id{1}), packet);
  std::vector<float> out(grad.size());
  codec.decompress(std::span<std::byte const>(packet).first(bytes), std::span<float>(out));
  if (out != grad) {
    std::fprintf(stderr, "fp16 round trip changed the values\n");
    return 1;
  }
  std::printf("gradcomp %d.%d.%d: %zu floats in a %zu-byte packet\n", GRADCOMP_VERSION_MAJOR,
              GRADCOMP_VERSION_MINOR, GRADCOMP_VERSION_PATCH, grad.size(), bytes);
  return 0;
}
