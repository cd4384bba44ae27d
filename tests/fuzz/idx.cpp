// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target: the training example's IDX (MNIST) reader, `train::parse_idx` and
// `train::idx_dataset` (examples/03_train_mlp/data.hpp).
//
// Input: one control byte, then the file(s).
//   bit 7 clear: bits 0-2 are the rank parse_idx expects, the rest is one IDX file;
//   bit 7 set: an image file and a label file for idx_dataset, the first `u16` bytes of the
//   rest being the image file.
//
// Oracles: a parsed file has the expected rank, no zero dimension and exactly the product of
// its dimensions in values; a dataset has one label per image, labels below the class count,
// pixels in [0, 1], and rows × columns values per image.

#include "fuzz.hpp"

#include "../../examples/03_train_mlp/data.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using namespace gradcomp_fuzz;
  input in(data, size);
  std::uint8_t const control = in.u8();
  auto as_u8 = [](std::span<std::byte const> b) {
    return std::span<std::uint8_t const>(reinterpret_cast<std::uint8_t const*>(b.data()), b.size());
  };
  if ((control & 0x80u) == 0) {
    std::size_t const rank = control & 7u;
    auto const file = as_u8(in.rest());
    train::idx_array a;
    if (!accepted([&] { a = train::parse_idx(file, rank, "fuzz"); })) return 0;
    std::uint64_t count = 1;
    for (auto d : a.dims) {
      GRADCOMP_FUZZ_CHECK(d != 0, "a zero dimension was accepted");
      count *= d;
    }
    GRADCOMP_FUZZ_CHECK(a.dims.size() == rank && a.values.size() == count,
                        "the values do not match the dimensions, or the rank is wrong");
    return 0;
  }
  std::size_t const image_bytes = in.u16();
  auto const images = as_u8(in.take(image_bytes));
  auto const labels = as_u8(in.rest());
  train::dataset d;
  if (!accepted([&] { d = train::idx_dataset(images, "images", labels, "labels", 10); })) return 0;
  GRADCOMP_FUZZ_CHECK(d.x.size() == d.size() * d.dim,
                      "a dataset whose pixels are not images × rows × columns");
  for (auto y : d.y) GRADCOMP_FUZZ_CHECK(y < d.classes, "a label beyond the class count");
  for (float v : d.x) GRADCOMP_FUZZ_CHECK(v >= 0.0f && v <= 1.0f, "a pixel outside [0, 1]");
  return 0;
}
