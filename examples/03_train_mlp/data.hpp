// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Data for the training example: a deterministic synthetic 10-class task (the default, built
/// from a seed in well under a second) and a reader for MNIST-format IDX files.
///
/// The synthetic task ("latent mixtures"): each class is a mixture of several Gaussian blobs in
/// a low-dimensional latent space, the blobs of all classes drawn at random and therefore
/// interleaved; each latent point is rendered to 784 "pixels" through a fixed random linear map
/// followed by tanh, plus pixel noise. A fraction of the training labels is replaced by a wrong
/// class (the test labels are clean). Because a class is a union of scattered blobs, a linear
/// classifier cannot separate the classes well, while an MLP can; and because the decision
/// boundaries are fine-grained, the optimizer needs many accurate small updates, which is where
/// aggressive gradient compression without error feedback falls behind.

#include <gradcomp/core/error.hpp>

#include "mlp.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace train {

/// Examples as rows of `dim` floats with a class label each.
struct dataset {
  std::vector<float> x;         ///< size() * dim values, row-major
  std::vector<std::uint8_t> y;  ///< size() labels, each < classes
  std::size_t dim = 0;
  std::size_t classes = 0;

  [[nodiscard]] std::size_t size() const noexcept { return y.size(); }
  [[nodiscard]] std::span<float const> row(std::size_t i) const noexcept {
    return std::span<float const>(x).subspan(i * dim, dim);
  }
};

/// A training set, a test set and a line saying where they came from.
struct data_split {
  dataset train;
  dataset test;
  std::string description;
};

// ---------------------------------------------------------------------------------------------
// The synthetic task.
// ---------------------------------------------------------------------------------------------

/// Parameters of the synthetic task (see file comment). The defaults are the demo's.
struct synthetic_options {
  std::size_t train = 24576;  ///< training examples
  std::size_t test = 4096;    ///< test examples
  std::size_t dim = 784;      ///< "pixels" per example
  std::size_t classes = 10;
  std::size_t latent = 24;    ///< latent dimensions
  std::size_t modes = 6;      ///< blobs per class
  double spread = 0.9;        ///< standard deviation of a blob (the centres have 1)
  double gain = 1.6;          ///< scale of the random map before tanh
  double pixel_noise = 0.5;   ///< standard deviation of the noise added to each pixel
  double label_noise = 0.05;  ///< fraction of training labels replaced by a wrong class
  std::uint64_t seed = 20260523;
};

/// Builds the synthetic task; the same options give the same bytes on every platform.
inline data_split make_synthetic(synthetic_options const& o) {
  if (o.classes < 2 || o.classes > 256 || o.dim == 0 || o.latent == 0 || o.modes == 0 ||
      o.train == 0 || o.test == 0) {
    throw gradcomp::config_error(
        "train: the synthetic task needs 2..256 classes and positive sizes (dim, latent, modes, "
        "train, test)");
  }
  if (!(o.label_noise >= 0.0 && o.label_noise < 1.0) || !(o.spread >= 0.0) ||
      !(o.pixel_noise >= 0.0) || !(o.gain > 0.0)) {
    throw gradcomp::config_error(
        "train: the synthetic task needs label_noise in [0, 1), spread >= 0, pixel_noise >= 0 "
        "and gain > 0");
  }
  rng r(o.seed);
  std::size_t const blobs = o.classes * o.modes;
  std::vector<double> centre(blobs * o.latent);
  for (double& v : centre) v = r.normal();
  std::vector<double> map(o.dim * o.latent), offset(o.dim);
  double const scale = o.gain / std::sqrt(static_cast<double>(o.latent));
  for (double& v : map) v = scale * r.normal();
  for (double& v : offset) v = 0.5 * r.normal();

  auto fill = [&](dataset& d, std::size_t n, double label_noise, std::uint64_t stream) {
    rng s(o.seed ^ (stream * 0x9e3779b97f4a7c15ull));
    d.dim = o.dim;
    d.classes = o.classes;
    d.x.resize(n * o.dim);
    d.y.resize(n);
    std::vector<double> z(o.latent);
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t const blob = s.below(blobs);
      std::size_t const cls = blob % o.classes;
      for (std::size_t k = 0; k < o.latent; ++k)
        z[k] = centre[blob * o.latent + k] + o.spread * s.normal();
      float* x = d.x.data() + i * o.dim;
      for (std::size_t p = 0; p < o.dim; ++p) {
        double a = offset[p];
        double const* m = map.data() + p * o.latent;
        for (std::size_t k = 0; k < o.latent; ++k) a += m[k] * z[k];
        x[p] = static_cast<float>(std::tanh(a) + o.pixel_noise * s.normal());
      }
      std::size_t label = cls;
      if (label_noise > 0.0 && s.uniform() < label_noise) {
        label = (cls + 1 + s.below(o.classes - 1)) % o.classes;  // a wrong class, uniformly
      }
      d.y[i] = static_cast<std::uint8_t>(label);
    }
  };
  data_split out;
  fill(out.train, o.train, o.label_noise, 1);
  fill(out.test, o.test, 0.0, 2);
  out.description = "synthetic latent mixtures: " + std::to_string(o.classes) + " classes x " +
                    std::to_string(o.modes) + " blobs in " + std::to_string(o.latent) +
                    " latent dims -> " + std::to_string(o.dim) + " features, " +
                    std::to_string(o.train) + " train / " + std::to_string(o.test) + " test, " +
                    std::to_string(static_cast<int>(std::lround(o.label_noise * 100))) +
                    "% train label noise, seed " + std::to_string(o.seed);
  return out;
}

// ---------------------------------------------------------------------------------------------
// IDX files (the MNIST format): big-endian header
//   u8 0, u8 0, u8 type (0x08 = unsigned byte), u8 number of dimensions,
//   one u32 per dimension, then the values, row-major.
// ---------------------------------------------------------------------------------------------

/// The contents of an IDX file of unsigned bytes.
struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> values;
};

/// Parses an IDX file image `bytes` (named `what` in error messages) that must have `rank`
/// dimensions of unsigned bytes. Throws `gradcomp::format_error` on anything malformed: a bad
/// magic number, another element type or rank, a zero dimension, a size that overflows, a
/// truncated file or trailing bytes.
inline idx_array parse_idx(std::span<std::uint8_t const> bytes, std::size_t rank,
                           std::string const& what) {
  auto fail = [&](std::string const& why) -> void {
    throw gradcomp::format_error("train: " + what + ": " + why);
  };
  auto hex = [](std::uint8_t b) {
    char const* digits = "0123456789abcdef";
    return std::string("0x") + digits[b >> 4] + digits[b & 15];
  };
  if (bytes.size() < 4) {
    fail("truncated: " + std::to_string(bytes.size()) + " bytes, an IDX header has at least 4");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    fail("not an IDX file: the magic number must start with two zero bytes (got " + hex(bytes[0]) +
         " " + hex(bytes[1]) + "); a gzip-compressed file must be unpacked first");
  }
  if (bytes[2] != 0x08) {
    fail("element type " + hex(bytes[2]) + " is not supported; expected 0x08 (unsigned byte)");
  }
  if (bytes[3] != rank) {
    fail("has " + std::to_string(bytes[3]) + " dimension(s), expected " + std::to_string(rank));
  }
  std::size_t const header = 4 + 4 * rank;
  if (bytes.size() < header) {
    fail("truncated header: " + std::to_string(bytes.size()) + " bytes, expected at least " +
         std::to_string(header));
  }
  idx_array a;
  std::uint64_t count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    std::uint8_t const* p = bytes.data() + 4 + 4 * d;
    std::uint32_t const v = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                            (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
    if (v == 0) fail("dimension " + std::to_string(d) + " is zero");
    if (count > std::numeric_limits<std::uint64_t>::max() / v) fail("the dimensions overflow");
    count *= v;
    a.dims.push_back(v);
  }
  std::uint64_t const expected = header + count;
  if (bytes.size() < expected) {
    fail("truncated: the header announces " + std::to_string(count) + " values (" +
         std::to_string(expected) + " bytes in all), the file has " + std::to_string(bytes.size()) +
         " bytes");
  }
  if (bytes.size() > expected) {
    fail(std::to_string(bytes.size() - expected) + " bytes after the " + std::to_string(count) +
         " values the header announces");
  }
  a.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

/// Reads a whole file; `gradcomp::config_error` when it cannot be opened.
inline std::vector<std::uint8_t> read_file_bytes(std::filesystem::path const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::string hint;
    std::filesystem::path gz = path;
    gz += ".gz";
    if (std::filesystem::exists(gz))
      hint = " (there is a " + gz.filename().string() + ": gunzip it first)";
    throw gradcomp::config_error("train: cannot open " + path.string() + hint);
  }
  std::vector<std::uint8_t> out((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  return out;
}

/// Builds a dataset from an IDX image file (3 dimensions: count, rows, columns) and an IDX
/// label file (1 dimension: count). Pixels are scaled to [0, 1]. Throws `gradcomp::format_error`
/// when the files are malformed, disagree on the count, or hold a label >= `classes`.
inline dataset idx_dataset(std::span<std::uint8_t const> images, std::string const& images_name,
                           std::span<std::uint8_t const> labels, std::string const& labels_name,
                           std::size_t classes = 10) {
  idx_array const im = parse_idx(images, 3, images_name);
  idx_array const lb = parse_idx(labels, 1, labels_name);
  if (im.dims[0] != lb.dims[0]) {
    throw gradcomp::format_error("train: " + images_name + " holds " + std::to_string(im.dims[0]) +
                                 " images but " + labels_name + " holds " +
                                 std::to_string(lb.dims[0]) + " labels; expected the same count");
  }
  dataset d;
  d.dim = std::size_t{im.dims[1]} * im.dims[2];
  d.classes = classes;
  d.y = lb.values;
  for (std::size_t i = 0; i < d.y.size(); ++i) {
    if (d.y[i] >= classes) {
      throw gradcomp::format_error("train: " + labels_name + ": label " + std::to_string(d.y[i]) +
                                   " at index " + std::to_string(i) + " is not below " +
                                   std::to_string(classes) + " classes");
    }
  }
  d.x.resize(im.values.size());
  for (std::size_t i = 0; i < im.values.size(); ++i)
    d.x[i] = static_cast<float>(im.values[i]) / 255.0f;
  return d;
}

/// Loads MNIST (or any data set in its layout) from `dir`: train-images-idx3-ubyte,
/// train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (unpacked).
inline data_split load_mnist(std::filesystem::path const& dir) {
  auto load = [&](char const* images, char const* labels) {
    std::vector<std::uint8_t> const im = read_file_bytes(dir / images);
    std::vector<std::uint8_t> const lb = read_file_bytes(dir / labels);
    return idx_dataset(im, (dir / images).string(), lb, (dir / labels).string());
  };
  data_split out;
  out.train = load("train-images-idx3-ubyte", "train-labels-idx1-ubyte");
  out.test = load("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte");
  if (out.train.dim != out.test.dim) {
    throw gradcomp::format_error("train: the training images have " +
                                 std::to_string(out.train.dim) + " pixels, the test images " +
                                 std::to_string(out.test.dim) + "; expected the same size");
  }
  out.description = "IDX files in " + dir.string() + ": " + std::to_string(out.train.size()) +
                    " train / " + std::to_string(out.test.size()) + " test, " +
                    std::to_string(out.train.dim) + " pixels";
  return out;
}

}  // namespace train
