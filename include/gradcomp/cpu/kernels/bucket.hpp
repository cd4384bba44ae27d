// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `bucket_cursor`: walks fixed-length buckets alongside a SIMD window loop without a division
/// per window.

#include <gradcomp/config.hpp>

#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace cpu::kernels {

/// Tracks which bucket of length `len` the current window starts in. Windows must be visited
/// in ascending order.
class bucket_cursor {
 public:
  bucket_cursor(std::size_t len, std::size_t first) noexcept
      : len_(len), index_(first / len), end_((first / len + 1) * len) {}

  /// Moves to the bucket holding element `w0` and returns whether [w0, w0 + count) lies in it.
  bool advance(std::size_t w0, std::size_t count) noexcept {
    while (w0 >= end_) {
      ++index_;
      end_ += len_;
    }
    return w0 + count <= end_;
  }
  /// Index of the current bucket.
  [[nodiscard]] std::size_t index() const noexcept { return index_; }

 private:
  std::size_t len_;
  std::size_t index_;
  std::size_t end_;
};

}  // namespace cpu::kernels
GRADCOMP_NAMESPACE_END
