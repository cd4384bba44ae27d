// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Scratch memory of the CUDA codecs: a bump allocator over the caller's workspace (CUB's
/// two-phase style: the same code sizes the workspace and carves it), and the two status words
/// through which kernels report problems (a non-finite input, an unencodable bucket, a code a
/// packet may not hold) to the host, which turns them into the CPU codecs' exceptions.

#include <gradcomp/cuda/config.cuh>

#include <cstddef>
#include <cstdint>

GRADCOMP_CUDA_NAMESPACE_BEGIN
namespace detail {

/// "No index reported" in a status word.
inline constexpr unsigned long long no_index = ~0ull;

/// What the kernels of one call report: the smallest element index and the smallest bucket
/// index at which something was wrong (`no_index` when nothing was). Both start at `no_index`.
struct status_words {
  unsigned long long element;
  unsigned long long bucket;
};

/// Lowers `*word` to `index`. Work items of one pass may report in any order; the host reads
/// the minimum, which is what a sequential loop would have found first.
GRADCOMP_HOST_DEVICE inline void report(unsigned long long* word,
                                        unsigned long long index) noexcept {
#if defined(__CUDA_ARCH__)
  if (index < *word) atomicMin(word, index);
#else
  if (index < *word) *word = index;  // the CPP system runs work items one after another
#endif
}

/// Carves typed arrays out of one buffer. With a null base it only counts, so the function that
/// carves a codec's workspace also computes its size. Every array starts on a 16-byte boundary;
/// the base itself may have any alignment (`slack` bytes are reserved for aligning it).
class arena {
 public:
  /// Bytes reserved for aligning an arbitrary base pointer.
  static constexpr std::size_t slack = 15;

  explicit arena(void* base) noexcept {
    if (base == nullptr) return;
    auto const addr = reinterpret_cast<std::uintptr_t>(base);
    base_ = reinterpret_cast<std::byte*>((addr + 15) / 16 * 16);
  }

  /// The next array of `count` elements of `T` (null when counting).
  template <class T>
  T* take(std::size_t count) noexcept {
    used_ = (used_ + 15) / 16 * 16;
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += count * sizeof(T);
    return p;
  }

  /// Bytes taken so far, from the aligned base.
  [[nodiscard]] std::size_t used() const noexcept { return used_; }

 private:
  std::byte* base_ = nullptr;
  std::size_t used_ = 0;
};

}  // namespace detail
GRADCOMP_CUDA_NAMESPACE_END
