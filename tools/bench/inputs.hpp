// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The inputs of `gradcomp-bench`: gradient files and synthetic gradients, all turned into
/// float32 vectors.
///
/// - `.npy` files (NumPy format 1.0, 2.0 or 3.0), little-endian float32 (`<f4`) or float16
///   (`<f2`), C order, any shape (flattened);
/// - raw files: bare little-endian values of `--dtype` (f32, f16, bf16), `--count` of them (0:
///   the whole file, which must then hold a whole number of values);
/// - a capture directory (what `gradcomp.capture` writes): a text file `index.tsv` whose first
///   line is `# gradcomp capture v1`, then the header `step<TAB>name<TAB>file`, then one line
///   per tensor and step; `file` is a `.npy` path relative to the directory;
/// - synthetic families: `gauss` (N(0, 1)), `laplace` (scale 1), `lognormal` (a random sign
///   times exp(N(0, 1))), `sparse:p=P` (a fraction P of exact zeros, N(0, 1) elsewhere), drawn
///   with a fixed seed per step.
///
/// Every problem with an input is an `input_error` whose message names the file and what is
/// wrong with it, so that the program prints one line and exits non-zero.

#include <gradcomp/core/dtype.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp_tool {

/// A bad input (file, option value or directory); the message is the whole explanation.
class input_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Element type of a file.
enum class dtype { f32, f16, bf16 };

/// Bytes per element.
constexpr std::size_t dtype_size(dtype t) noexcept { return t == dtype::f32 ? 4 : 2; }

/// "f32", "f16", "bf16".
constexpr char const* dtype_name(dtype t) noexcept {
  return t == dtype::f32 ? "f32" : t == dtype::f16 ? "f16" : "bf16";
}

/// Parses a `--dtype` value: f32|float32, f16|float16, bf16|bfloat16.
inline dtype parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32") return dtype::f32;
  if (s == "f16" || s == "float16") return dtype::f16;
  if (s == "bf16" || s == "bfloat16") return dtype::bf16;
  throw input_error("--dtype '" + std::string(s) + "' is not a dtype (expected f32, f16 or bf16)");
}

/// Little-endian values of `t` at `p` (n of them) as float32.
inline std::vector<float> decode_values(std::byte const* p, std::size_t n, dtype t) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char const* b = reinterpret_cast<unsigned char const*>(p) + i * dtype_size(t);
    if (t == dtype::f32) {
      std::uint32_t const u = std::uint32_t{b[0]} | std::uint32_t{b[1]} << 8 |
                              std::uint32_t{b[2]} << 16 | std::uint32_t{b[3]} << 24;
      std::memcpy(&out[i], &u, 4);
    } else {
      auto const u = static_cast<std::uint16_t>(b[0] | b[1] << 8);
      out[i] = t == dtype::f16 ? gradcomp::half_bits_to_float(u) : gradcomp::bfloat16_bits_to_float(u);
    }
  }
  return out;
}

/// The whole content of file `path`; `input_error` when it cannot be read.
inline std::vector<std::byte> read_file(std::filesystem::path const& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw input_error(path.string() + ": no such file");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) throw input_error(path.string() + ": cannot open");
  f.seekg(0, std::ios::end);
  auto const size = static_cast<std::size_t>(f.tellg());
  f.seekg(0);
  std::vector<std::byte> data(size);
  if (size > 0 && !f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size))) {
    throw input_error(path.string() + ": read failed");
  }
  return data;
}

/// What a `.npy` header says.
struct npy_header {
  dtype type = dtype::f32;
  std::vector<std::size_t> shape;
  std::size_t data_offset = 0;  ///< where the values start
  [[nodiscard]] std::size_t count() const {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    return n;
  }
};

namespace detail {

// The value of `key` in the header's Python dict literal, as written (quotes kept).
inline std::string npy_field(std::string const& dict, std::string const& key, std::string const& where) {
  std::size_t k = dict.find("'" + key + "'");
  if (k == std::string::npos) throw input_error(where + ": malformed .npy header (no '" + key + "')");
  k = dict.find(':', k);
  if (k == std::string::npos) throw input_error(where + ": malformed .npy header (" + key + ")");
  ++k;
  while (k < dict.size() && dict[k] == ' ') ++k;
  std::size_t end = k;
  if (k < dict.size() && dict[k] == '(') {
    end = dict.find(')', k);
    if (end == std::string::npos) throw input_error(where + ": malformed .npy header (shape)");
    ++end;
  } else {
    while (end < dict.size() && dict[end] != ',' && dict[end] != '}') ++end;
  }
  std::string v = dict.substr(k, end - k);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace detail

/// Parses the header of a `.npy` file held in `data` (`where` names it in messages).
inline npy_header parse_npy_header(std::span<std::byte const> data, std::string const& where) {
  auto const* b = reinterpret_cast<unsigned char const*>(data.data());
  if (data.size() < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) {
    throw input_error(where + ": not a .npy file (no \\x93NUMPY magic)");
  }
  unsigned const major = b[6];
  std::size_t len = 0, start = 0;
  if (major == 1) {
    len = std::size_t{b[8]} | std::size_t{b[9]} << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) throw input_error(where + ": truncated .npy header");
    len = std::size_t{b[8]} | std::size_t{b[9]} << 8 | std::size_t{b[10]} << 16 | std::size_t{b[11]} << 24;
    start = 12;
  } else {
    throw input_error(where + ": unsupported .npy format version " + std::to_string(major));
  }
  if (data.size() < start + len) throw input_error(where + ": truncated .npy header");
  std::string const dict(reinterpret_cast<char const*>(b + start), len);
  npy_header h;
  h.data_offset = start + len;
  std::string const descr = detail::npy_field(dict, "descr", where);
  if (descr == "'<f4'" || descr == "'=f4'") {
    h.type = dtype::f32;
  } else if (descr == "'<f2'" || descr == "'=f2'") {
    h.type = dtype::f16;
  } else {
    throw input_error(where + ": dtype " + descr +
                      " is not supported (float32 '<f4' or float16 '<f2'; bfloat16 as a raw file "
                      "with --dtype bf16)");
  }
  std::string const order = detail::npy_field(dict, "fortran_order", where);
  if (order != "False") {
    throw input_error(where + ": Fortran-order arrays are not supported (save it in C order)");
  }
  std::string shape = detail::npy_field(dict, "shape", where);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
    throw input_error(where + ": malformed .npy header (shape " + shape + ")");
  }
  std::stringstream ss(shape.substr(1, shape.size() - 2));
  std::string dim;
  while (std::getline(ss, dim, ',')) {
    dim.erase(std::remove(dim.begin(), dim.end(), ' '), dim.end());
    if (dim.empty()) continue;
    if (dim.find_first_not_of("0123456789") != std::string::npos) {
      throw input_error(where + ": malformed .npy header (shape " + shape + ")");
    }
    h.shape.push_back(static_cast<std::size_t>(std::stoull(dim)));
  }
  return h;
}

/// The values of a `.npy` file as float32.
inline std::vector<float> read_npy(std::filesystem::path const& path) {
  std::vector<std::byte> const data = read_file(path);
  std::string const where = path.string();
  npy_header const h = parse_npy_header(data, where);
  std::size_t const n = h.count();
  std::size_t const need = n * dtype_size(h.type);
  if (data.size() - h.data_offset < need) {
    throw input_error(where + ": truncated: the header promises " + std::to_string(n) + " values (" +
                      std::to_string(need) + " bytes), the file holds " +
                      std::to_string(data.size() - h.data_offset) + " bytes of data");
  }
  if (data.size() - h.data_offset > need) {
    throw input_error(where + ": " + std::to_string(data.size() - h.data_offset - need) +
                      " bytes after the data (malformed .npy)");
  }
  if (n == 0) throw input_error(where + ": the array is empty");
  return decode_values(data.data() + h.data_offset, n, h.type);
}

/// Writes float32 values as a `.npy` file (format 1.0, shape (n,)).
inline void write_npy(std::filesystem::path const& path, std::span<float const> v) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(v.size()) + ",), }";
  std::size_t const total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) throw input_error(path.string() + ": cannot write");
  f.write("\x93NUMPY\x01\x00", 8);
  char const len[2] = {static_cast<char>(dict.size() & 0xff), static_cast<char>(dict.size() >> 8)};
  f.write(len, 2);
  f.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  for (float x : v) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, 4);
    char const bytes[4] = {static_cast<char>(u & 0xff), static_cast<char>((u >> 8) & 0xff),
                           static_cast<char>((u >> 16) & 0xff), static_cast<char>(u >> 24)};
    f.write(bytes, 4);
  }
  if (!f) throw input_error(path.string() + ": write failed");
}

/// The values of a raw file of `t` (`count` values; 0: the whole file).
inline std::vector<float> read_raw(std::filesystem::path const& path, dtype t, std::size_t count) {
  std::vector<std::byte> const data = read_file(path);
  std::string const where = path.string();
  std::size_t const size = dtype_size(t);
  if (count == 0) {
    if (data.size() % size != 0) {
      throw input_error(where + ": " + std::to_string(data.size()) + " bytes is not a whole number of " +
                        dtype_name(t) + " values (wrong --dtype?)");
    }
    count = data.size() / size;
  }
  if (count == 0) throw input_error(where + ": the file is empty");
  if (data.size() < count * size) {
    throw input_error(where + ": --count " + std::to_string(count) + " " + dtype_name(t) + " values need " +
                      std::to_string(count * size) + " bytes; the file has " + std::to_string(data.size()));
  }
  return decode_values(data.data(), count, t);
}

/// One tensor of one step of a capture directory.
struct capture_entry {
  std::uint64_t step = 0;
  std::string name;
  std::filesystem::path file;
};

/// Name of the index file of a capture directory, and its first line.
inline constexpr char const* capture_index = "index.tsv";
inline constexpr char const* capture_magic = "# gradcomp capture v1";

/// Reads the index of capture directory `dir`, in file order.
inline std::vector<capture_entry> read_capture_index(std::filesystem::path const& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw input_error(dir.string() + ": not a directory");
  std::filesystem::path const index = dir / capture_index;
  if (!std::filesystem::exists(index, ec)) {
    bool empty = std::filesystem::directory_iterator(dir, ec) == std::filesystem::directory_iterator();
    throw input_error(dir.string() + (empty ? ": empty directory (no " : ": no ") + capture_index +
                      "; expected a directory written by gradcomp.capture)");
  }
  std::ifstream f(index);
  std::string line;
  if (!std::getline(f, line) || line.rfind(capture_magic, 0) != 0) {
    throw input_error(index.string() + ": first line is not '" + capture_magic + "'");
  }
  if (!std::getline(f, line) || line != "step\tname\tfile") {
    throw input_error(index.string() + ": second line is not the header 'step<TAB>name<TAB>file'");
  }
  std::vector<capture_entry> out;
  std::size_t lineno = 2;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::size_t const t1 = line.find('\t');
    std::size_t const t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    std::string const step = line.substr(0, t1);
    if (t2 == std::string::npos || step.empty() || step.find_first_not_of("0123456789") != std::string::npos ||
        line.find('\t', t2 + 1) != std::string::npos) {
      throw input_error(index.string() + ":" + std::to_string(lineno) +
                        ": expected 'step<TAB>name<TAB>file' with a numeric step");
    }
    out.push_back({std::stoull(step), line.substr(t1 + 1, t2 - t1 - 1), dir / line.substr(t2 + 1)});
  }
  if (out.empty()) throw input_error(index.string() + ": lists no tensors");
  return out;
}

/// Writes the index of a capture directory (what `gradcomp.capture` writes; for tests).
inline void write_capture_index(std::filesystem::path const& dir, std::vector<capture_entry> const& entries) {
  std::ofstream f(dir / capture_index);
  f << capture_magic << "\nstep\tname\tfile\n";
  for (auto const& e : entries) {
    f << e.step << '\t' << e.name << '\t' << std::filesystem::relative(e.file, dir).generic_string() << '\n';
  }
}

/// A synthetic family: `gauss`, `laplace`, `lognormal` or `sparse:p=P`.
struct synthetic {
  enum class kind { gauss, laplace, lognormal, sparse } family = kind::gauss;
  double p = 0.66;  ///< fraction of zeros (`sparse`)
  std::string spec;

  /// Parses a family spec; `input_error` naming `--synthetic` for anything else.
  static synthetic parse(std::string const& s) {
    synthetic out;
    out.spec = s;
    if (s == "gauss") return out;
    if (s == "laplace") {
      out.family = kind::laplace;
      return out;
    }
    if (s == "lognormal") {
      out.family = kind::lognormal;
      return out;
    }
    if (s == "sparse" || s.rfind("sparse:", 0) == 0) {
      out.family = kind::sparse;
      if (s.size() > 6) {
        std::string const opt = s.substr(7);
        if (opt.rfind("p=", 0) != 0) throw input_error("--synthetic '" + s + "': sparse takes p=FRACTION");
        char* end = nullptr;
        out.p = std::strtod(opt.c_str() + 2, &end);
        if (end == opt.c_str() + 2 || *end != '\0' || !(out.p >= 0.0 && out.p < 1.0)) {
          throw input_error("--synthetic '" + s + "': p must be a number in [0, 1)");
        }
      }
      return out;
    }
    throw input_error("--synthetic '" + s + "' is not a family (expected gauss, laplace, lognormal or sparse:p=P)");
  }

  /// n values of step `step` (a fixed seed per step).
  [[nodiscard]] std::vector<float> draw(std::size_t n, std::uint64_t step) const {
    std::mt19937_64 rng(0x9e3779b97f4a7c15ull + 7919 * step);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::exponential_distribution<float> expo(1.0f);
    std::vector<float> v(n);
    for (float& x : v) {
      switch (family) {
        case kind::gauss: x = normal(rng); break;
        case kind::laplace: x = (uniform(rng) < 0.5 ? -1.0f : 1.0f) * expo(rng); break;
        case kind::lognormal: x = (uniform(rng) < 0.5 ? -1.0f : 1.0f) * std::exp(normal(rng)); break;
        case kind::sparse: x = uniform(rng) < p ? 0.0f : normal(rng); break;
      }
    }
    return v;
  }
};

}  // namespace gradcomp_tool
