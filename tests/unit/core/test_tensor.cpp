// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// core/tensor.hpp: tensor_view construction, const conversion and identity.

#include <gradcomp/core/tensor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <span>
#include <type_traits>
#include <vector>

namespace gc = gradcomp;

namespace {

template <class T>
concept view_type_exists = requires {
  typename gc::tensor_view<T>;
};

}  // namespace

// Element types only, const or not.
static_assert(view_type_exists<float>);
static_assert(view_type_exists<gc::half const>);
static_assert(view_type_exists<gc::bfloat16>);
static_assert(!view_type_exists<double>);
static_assert(!view_type_exists<int const>);

// Mutable -> const converts implicitly; const -> mutable and cross-type do not.
static_assert(std::is_convertible_v<gc::tensor_view<float>, gc::tensor_view<float const>>);
static_assert(std::is_convertible_v<gc::tensor_view<gc::half>, gc::tensor_view<gc::half const>>);
static_assert(!std::is_convertible_v<gc::tensor_view<float const>, gc::tensor_view<float>>);
static_assert(!std::is_constructible_v<gc::tensor_view<float>, gc::tensor_view<float const>>);
static_assert(!std::is_constructible_v<gc::tensor_view<float const>, gc::tensor_view<gc::half>>);
static_assert(
    !std::is_constructible_v<gc::tensor_view<gc::bfloat16 const>, gc::tensor_view<gc::half>>);
static_assert(std::is_same_v<gc::tensor_view<float const>::value_type, float>);
static_assert(std::is_same_v<gc::tensor_view<float const>::element_type, float const>);
static_assert(std::is_trivially_copyable_v<gc::tensor_view<float>>);
static_assert(std::is_nothrow_copy_constructible_v<gc::tensor_view<gc::half const>>);

// Usable in constant expressions.
constexpr float const k_values[3] = {1.0f, 2.0f, 3.0f};
constexpr gc::tensor_view<float const> k_view(std::span<float const>(k_values), gc::tensor_id{4});
static_assert(k_view.size() == 3 && k_view[1] == 2.0f && k_view.id() == gc::tensor_id{4});

TEST_CASE("tensor_view: construction and accessors", "[core][tensor]") {
  gc::tensor_view<float> empty;
  CHECK(empty.empty());
  CHECK(empty.size() == 0);
  CHECK(empty.data() == nullptr);
  CHECK(empty.id() == gc::tensor_id{0});

  std::vector<float> v = {1.0f, -2.0f, 3.5f, 0.25f};
  gc::tensor_view<float> t(v, gc::tensor_id{17});
  CHECK_FALSE(t.empty());
  CHECK(t.size() == 4);
  CHECK(t.data() == v.data());
  CHECK(t.span().data() == v.data());
  CHECK(t.span().size() == 4);
  CHECK(t.id() == gc::tensor_id{17});
  CHECK(t[2] == 3.5f);
  t[1] = 9.0f;  // writes through
  CHECK(v[1] == 9.0f);

  // Default id is 0.
  gc::tensor_view<float> t0(v);
  CHECK(t0.id() == gc::tensor_id{0});

  // Deduction guide.
  gc::tensor_view deduced(std::span<float>(v), gc::tensor_id{3});
  static_assert(std::is_same_v<decltype(deduced), gc::tensor_view<float>>);
  CHECK(deduced.id() == gc::tensor_id{3});

  // Large ids survive.
  gc::tensor_view<float> big(v, gc::tensor_id{0xffffffffu});
  CHECK(static_cast<std::uint32_t>(big.id()) == 0xffffffffu);
}

TEST_CASE("tensor_view: const conversion keeps data and id", "[core][tensor]") {
  std::array<gc::half, 3> h = {gc::half(1.0f), gc::half(2.0f), gc::half(-1.0f)};
  gc::tensor_view<gc::half> m(h, gc::tensor_id{42});
  gc::tensor_view<gc::half const> c = m;
  CHECK(c.data() == h.data());
  CHECK(c.size() == 3);
  CHECK(c.id() == gc::tensor_id{42});
  CHECK(static_cast<float>(c[2]) == -1.0f);

  std::vector<gc::bfloat16> const b(5, gc::bfloat16(0.5f));
  auto const view = gc::make_view<gc::bfloat16>(b, gc::tensor_id{7});
  static_assert(std::is_same_v<decltype(view), gc::tensor_view<gc::bfloat16 const> const>);
  CHECK(view.size() == 5);
  CHECK(view.id() == gc::tensor_id{7});
  CHECK(view.data() == b.data());
  CHECK(gc::make_view<float>(std::span<float const>()).empty());
}
