// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Non-owning views of contiguous gradient tensors. A view carries a `tensor_id`, which keys
/// per-tensor state (error-feedback residuals) and the counter-based random stream, so the same
/// tensor draws the same random numbers on every rank, thread count and backend.

#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// Identifies one gradient tensor (e.g. a layer's weight) across steps and ranks.
enum class tensor_id : std::uint32_t {};

/// A contiguous tensor of `T` (possibly `const`) with its identity. Cheap to copy.
template <class T>
  requires element<std::remove_const_t<T>>
class tensor_view {
 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  constexpr tensor_view() noexcept = default;
  /// Views `data` as tensor `id`.
  constexpr tensor_view(std::span<T> data, tensor_id id = tensor_id{0}) noexcept
      : data_(data), id_(id) {}
  /// A const view of a mutable one.
  template <class U>
    requires(std::is_const_v<T> && std::same_as<std::remove_const_t<T>, U>)
  constexpr tensor_view(tensor_view<U> other) noexcept : data_(other.span()), id_(other.id()) {}

  [[nodiscard]] constexpr std::span<T> span() const noexcept { return data_; }
  [[nodiscard]] constexpr T* data() const noexcept { return data_.data(); }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return data_.size(); }
  [[nodiscard]] constexpr bool empty() const noexcept { return data_.empty(); }
  [[nodiscard]] constexpr tensor_id id() const noexcept { return id_; }
  [[nodiscard]] constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  std::span<T> data_{};
  tensor_id id_{0};
};

template <class T>
tensor_view(std::span<T>, tensor_id) -> tensor_view<T>;

/// Makes a read-only view of `data` as tensor `id`.
template <element T>
constexpr tensor_view<T const> make_view(std::span<T const> data, tensor_id id = tensor_id{0}) {
  return tensor_view<T const>(data, id);
}

GRADCOMP_NAMESPACE_END
