// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// PowerSGD's wire format and the parts of its arithmetic every backend shares: the mode of a
/// shape, the packet variants and their validation (with the CPU's messages), the Philox
/// Gaussian start of Q and the orthonormalization of P (host code, sums in double). The CPU
/// state (codec/powersgd.hpp) and the CUDA state (cuda/powersgd.cuh) call these; the GEMM
/// orders both follow are core/gemm_order.hpp's.
///
/// Packet: header (codec powersgd, param0 = cols, param1 = rank, 0 when dense; variant 0 = low
/// rank, 1 = dense), then P (r × rows) and Q (r × cols), column by column, or the dense matrix,
/// all f32 little-endian and finite.

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/fingerprint.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// How a matrix is sent.
enum class powersgd_mode : std::uint8_t {
  low_rank = 0,  ///< factors P (rows × r) and Q (cols × r)
  dense = 1,     ///< the matrix itself, f32 (too small to gain)
};

/// The mode PowerSGD uses for a rows × cols matrix.
constexpr powersgd_mode powersgd_mode_for(std::uint64_t rows, std::uint64_t cols,
                                          std::uint32_t rank, std::uint64_t min_elements) noexcept {
  if (rows == 0 || cols == 0) return powersgd_mode::dense;
  std::uint64_t const n = rows * cols;
  if (n < min_elements) return powersgd_mode::dense;
  // r (rows + cols) >= rows cols, evaluated without overflow: r >= rows cols / (rows + cols).
  long double const ratio = static_cast<long double>(rows) * static_cast<long double>(cols) /
                            (static_cast<long double>(rows) + static_cast<long double>(cols));
  return static_cast<long double>(rank) >= ratio ? powersgd_mode::dense : powersgd_mode::low_rank;
}

namespace detail::psgd {

/// Packet variants (header byte 7).
inline constexpr std::uint8_t variant_low_rank = 0;
inline constexpr std::uint8_t variant_dense = 1;

/// Threshold below which an orthogonalized column counts as dependent, relative to its norm
/// before the projections.
inline constexpr double dependent_ratio = 1e-4;

inline std::string shape_text(std::size_t rows, std::size_t cols) {
  return std::to_string(rows) + " × " + std::to_string(cols);
}

/// Standard normal from two 32-bit words (Box-Muller; u1 in (0, 1]).
inline float gaussian(std::uint32_t w0, std::uint32_t w1) noexcept {
  double const u1 = (static_cast<double>(w0) + 1.0) * 0x1p-32;
  double const u2 = static_cast<double>(w1) * 0x1p-32;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

/// v[i] = N(0, 1) draw of block `base + i` of `rs`, i < n.
inline void fill_gaussian(float* v, std::size_t n, random_stream const& rs,
                          std::uint64_t base) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    philox_block const b = rs.block(base + i);
    v[i] = gaussian(b[0], b[1]);
  }
}

inline double dot(float const* x, float const* y, std::size_t n) noexcept {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(y[i]);
  return s;
}

/// v -= <v, u_d> u_d for the first `c` columns of `u` (modified Gram-Schmidt), twice.
inline void project_out(float* v, float const* u, std::size_t c, std::size_t rows) noexcept {
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t d = 0; d < c; ++d) {
      float const* ud = u + d * rows;
      double const h = dot(v, ud, rows);
      for (std::size_t i = 0; i < rows; ++i) {
        v[i] = static_cast<float>(static_cast<double>(v[i]) - h * static_cast<double>(ud[i]));
      }
    }
  }
}

/// Orthonormalizes the r columns of p (rows each) in place: modified Gram-Schmidt, each
/// projection done twice ("twice is enough"), sums in double. A column whose norm falls below
/// `dependent_ratio` of its norm before the projections (or is zero) is replaced by a Philox
/// Gaussian vector keyed by (seed, step, tensor, column), orthogonalized the same way, so all
/// ranks (which hold the same reduced P) make the same choice.
inline void orthonormalize(float* p, std::size_t rows, std::size_t r, random_stream const& rs) {
  for (std::size_t c = 0; c < r; ++c) {
    float* v = p + c * rows;
    double const before = std::sqrt(dot(v, v, rows));
    project_out(v, p, c, rows);
    double norm = std::sqrt(dot(v, v, rows));
    if (!(norm > dependent_ratio * before) || !(norm > 0x1p-100)) {
      fill_gaussian(v, rows, rs, (std::uint64_t{1} << 63) | (static_cast<std::uint64_t>(c) << 40));
      project_out(v, p, c, rows);
      norm = std::sqrt(dot(v, v, rows));
    }
    if (!(norm > 0.0)) {  // cannot happen for r < rows; keep the column harmless
      std::fill(v, v + rows, 0.0f);
      continue;
    }
    double const inv = 1.0 / norm;
    for (std::size_t i = 0; i < rows; ++i)
      v[i] = static_cast<float>(static_cast<double>(v[i]) * inv);
  }
}

/// The `numeric_error` of a non-finite gradient value `v` at element `at` of a matrix of
/// `cols` columns (tensor `id`), before the state changes.
[[noreturn]] inline void throw_nonfinite_gradient(float v, std::size_t at, std::size_t cols, tensor_id id) {
  throw numeric_error("gradcomp: powersgd cannot compress the non-finite gradient value " +
                      std::to_string(v) + " at element " + std::to_string(at) +
                      " (row " + std::to_string(cols ? at / cols : 0) + ", column " +
                      std::to_string(cols ? at % cols : 0) + ") of tensor " +
                      std::to_string(static_cast<unsigned>(id)) + "; the state is unchanged");
}

/// The `numeric_error` of a step whose (all-reduced) P is not finite; the step is abandoned.
[[noreturn]] inline void throw_nonfinite_p(tensor_id id) {
  throw numeric_error("gradcomp: powersgd: the all-reduced P of tensor " +
                      std::to_string(static_cast<unsigned>(id)) +
                      " is not finite (a rank's gradient or residual overflowed); the step "
                      "was abandoned");
}

/// The `numeric_error` of a step whose reduced Q (or dense matrix) is not finite.
[[noreturn]] inline void throw_nonfinite_q(tensor_id id) {
  throw numeric_error("gradcomp: powersgd: the reduced Q (or dense matrix) of tensor " +
                      std::to_string(static_cast<unsigned>(id)) +
                      " is not finite; the step was abandoned");
}

/// The `format_error` of a packet whose payload value i is not finite.
[[noreturn]] inline void throw_nonfinite_value(std::uint64_t i) {
  throw format_error("gradcomp: powersgd packet: value " + std::to_string(i) +
                     " of the payload is not finite (a valid packet has none)");
}

/// Throws `format_error` unless the packet declares `payload` payload bytes.
inline void expect(packet_header const& h, std::uint64_t payload) {
  if (h.payload_bytes != payload) {
    throw format_error("gradcomp: powersgd packet of " + std::to_string(h.count) +
                       " elements declares " + std::to_string(h.payload_bytes) +
                       " payload bytes, its shape and rank imply " + std::to_string(payload));
  }
}

/// The header checks of a powersgd packet (all but the payload's finiteness); `format_error`.
inline void validate(packet_header const& h) {
  auto fail = [&](std::string const& what) {
    throw format_error("gradcomp: powersgd packet: " + what);
  };
  if (h.codec != codec_id::powersgd) {
    fail(std::string("written by codec '") + codec_name(h.codec) + "' (id " +
         std::to_string(static_cast<unsigned>(h.codec)) + ")");
  }
  std::uint64_t const cols = h.param0;
  if (h.variant > detail::psgd::variant_dense) {
    fail("unknown variant " + std::to_string(static_cast<unsigned>(h.variant)) +
         " (expected 0 = low rank, 1 = dense)");
  }
  if (h.count > 0 && (cols == 0 || h.count % cols != 0)) {
    fail(std::to_string(h.count) + " elements are not a whole number of rows of " +
         std::to_string(cols) + " columns");
  }
  if (h.variant == detail::psgd::variant_dense) {
    if (h.param1 != 0)
      fail("dense packet with rank " + std::to_string(h.param1) + " (expected 0)");
    if (h.count > UINT64_MAX / 4) fail("element count overflows");
    expect(h, 4 * h.count);
  } else {
    // (checked before the division: an empty matrix may come with 0 columns)
    if (h.count == 0) fail("low-rank packet of an empty matrix");
    std::uint64_t const rows = h.count / cols;
    if (h.param1 == 0) fail("low-rank packet with rank 0");
    std::uint64_t const per = rows + cols;
    if (per > UINT64_MAX / 4 / h.param1) fail("factor sizes overflow");
    expect(h, 4 * std::uint64_t{h.param1} * per);
  }
}

/// The shape fingerprint of a PowerSGD session of a rows × cols matrix (rank, mode): what the
/// low-rank collective's agreement round compares, the same for `powersgd_session` and
/// `cuda::powersgd_session`, so ranks of both kinds agree.
inline std::uint64_t session_fingerprint(std::size_t rows, std::size_t cols, std::uint32_t rank,
                                         powersgd_mode mode) noexcept {
  return fingerprint{}
      .add("powersgd")
      .add(static_cast<std::uint64_t>(rows))
      .add(static_cast<std::uint64_t>(cols))
      .add(static_cast<std::uint64_t>(rank))
      .add(static_cast<std::uint64_t>(mode))
      .value();
}

/// Factors a PowerSGD session exchanges per step: 2 (P, then Q) for a low-rank matrix, 1 (the
/// matrix itself) for a dense one.
constexpr std::size_t session_factor_count(powersgd_mode mode) noexcept {
  return mode == powersgd_mode::dense ? 1 : 2;
}

/// Floats of factor `i` of a session (known before it is computed): P (rank × rows) or the
/// dense matrix, then Q (rank × cols); 0 past the last.
constexpr std::size_t session_factor_size(powersgd_mode mode, std::size_t rows, std::size_t cols, std::uint32_t rank,
                                          std::size_t i) noexcept {
  if (mode == powersgd_mode::dense) return i == 0 ? rows * cols : 0;
  return i > 1 ? 0 : std::size_t{rank} * (i == 0 ? rows : cols);
}

}  // namespace detail::psgd
GRADCOMP_NAMESPACE_END
