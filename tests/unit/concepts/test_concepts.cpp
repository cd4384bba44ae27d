// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// concepts/codec.hpp and concepts/feedback.hpp: what is and what is not a codec, a run-time
// codec (codec_operations) or an error-feedback policy. The concepts are nominal: looking like
// one is not enough without the opt-in tag.

#include <gradcomp/gradcomp.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <span>
#include <string>

namespace gc = gradcomp;

namespace {

// All operations of a codec, but declared only: used in unevaluated contexts.
#define FAKE_CODEC_OPERATIONS                                                                    \
  std::size_t max_compressed_bytes(std::size_t) const;                                           \
  double bits_per_element() const;                                                               \
  template <gc::element T>                                                                       \
  std::size_t compress(gc::tensor_view<T const>, std::span<std::byte>, gc::codec_context const&) \
      const;                                                                                     \
  template <gc::element T>                                                                       \
  void decompress(std::span<std::byte const>, std::span<T>, gc::codec_context const&) const;     \
  template <gc::element T>                                                                       \
  void decompress_add(std::span<std::byte const>, std::span<T>, float, gc::codec_context const&) \
      const;

#define FAKE_CODEC_TRAITS                                                           \
  static constexpr gc::codec_id id = gc::codec_id::identity;                        \
  static constexpr gc::aggregation_kind aggregation = gc::aggregation_kind::gather; \
  static constexpr bool unbiased = false;

// Everything: a codec.
struct complete_codec {
  using codec_concept = gc::codec_tag;
  FAKE_CODEC_TRAITS
  FAKE_CODEC_OPERATIONS
};

// A tag type derived from codec_tag is fine too.
struct derived_tag : gc::codec_tag {};
struct codec_with_derived_tag {
  using codec_concept = derived_tag;
  FAKE_CODEC_TRAITS
  FAKE_CODEC_OPERATIONS
};

// Every operation and trait but no opt-in tag: not a codec, though it has the operations.
struct untagged {
  FAKE_CODEC_TRAITS
  FAKE_CODEC_OPERATIONS
};

// The wrong tag.
struct wrong_tag {
  using codec_concept = int;
  FAKE_CODEC_TRAITS
  FAKE_CODEC_OPERATIONS
};
struct feedback_tag_as_codec_tag {
  using codec_concept = gc::feedback_tag;
  FAKE_CODEC_TRAITS
  FAKE_CODEC_OPERATIONS
};

// Tagged, operations, but a missing trait.
struct no_unbiased {
  using codec_concept = gc::codec_tag;
  static constexpr gc::codec_id id = gc::codec_id::identity;
  static constexpr gc::aggregation_kind aggregation = gc::aggregation_kind::gather;
  FAKE_CODEC_OPERATIONS
};
struct no_id {
  using codec_concept = gc::codec_tag;
  static constexpr gc::aggregation_kind aggregation = gc::aggregation_kind::gather;
  static constexpr bool unbiased = false;
  FAKE_CODEC_OPERATIONS
};

// Tagged, but decompress_add only for float.
struct float_only_decompress_add {
  using codec_concept = gc::codec_tag;
  FAKE_CODEC_TRAITS
  std::size_t max_compressed_bytes(std::size_t) const;
  double bits_per_element() const;
  template <gc::element T>
  std::size_t compress(gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const;
  template <gc::element T>
  void decompress(std::span<std::byte const>, std::span<T>, gc::codec_context const&) const;
  void decompress_add(std::span<std::byte const>, std::span<float>, float,
                      gc::codec_context const&) const;
};

// Tagged, but compress returns int, not std::size_t.
struct compress_returns_int {
  using codec_concept = gc::codec_tag;
  FAKE_CODEC_TRAITS
  std::size_t max_compressed_bytes(std::size_t) const;
  double bits_per_element() const;
  template <gc::element T>
  int compress(gc::tensor_view<T const>, std::span<std::byte>, gc::codec_context const&) const;
  template <gc::element T>
  void decompress(std::span<std::byte const>, std::span<T>, gc::codec_context const&) const;
  template <gc::element T>
  void decompress_add(std::span<std::byte const>, std::span<T>, float,
                      gc::codec_context const&) const;
};

// Tagged, but the operations are not const.
struct non_const_operations {
  using codec_concept = gc::codec_tag;
  FAKE_CODEC_TRAITS
  std::size_t max_compressed_bytes(std::size_t);
  double bits_per_element();
  template <gc::element T>
  std::size_t compress(gc::tensor_view<T const>, std::span<std::byte>, gc::codec_context const&);
  template <gc::element T>
  void decompress(std::span<std::byte const>, std::span<T>, gc::codec_context const&);
  template <gc::element T>
  void decompress_add(std::span<std::byte const>, std::span<T>, float, gc::codec_context const&);
};

#undef FAKE_CODEC_OPERATIONS
#undef FAKE_CODEC_TRAITS

// --- feedback policies ---------------------------------------------------------------------

struct good_state {
  std::span<float const> values() const;
  void assign(std::span<float const>);
};

// The one-phase step only: no longer a feedback policy (the pipeline stages and commits).
struct one_phase_policy {
  using feedback_concept = gc::feedback_tag;
  static constexpr gc::feedback_id id = gc::feedback_id::residual;
  using state = good_state;
  template <class C, gc::element T>
  std::size_t compress(C const&, state&, gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const;
};

struct complete_policy : one_phase_policy {
  template <gc::element T>
  std::span<float const> stage(state&, gc::tensor_view<T const>, gc::codec_context const&) const;
  template <class C>
  void commit(C const&, state&, std::span<std::byte const>, gc::codec_context const&) const;
  template <class C>
  void prepare_commit(C const&, state&, std::span<std::byte const>, gc::codec_context const&) const;
  void apply_commit(state&) const;
  void commit_lossless(state&) const;
};

struct untagged_policy {
  static constexpr gc::feedback_id id = gc::feedback_id::residual;
  using state = good_state;
  template <class C, gc::element T>
  std::size_t compress(C const&, state&, gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const;
};

struct codec_tagged_policy {
  using feedback_concept = gc::codec_tag;
  static constexpr gc::feedback_id id = gc::feedback_id::residual;
  using state = good_state;
  template <class C, gc::element T>
  std::size_t compress(C const&, state&, gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const;
};

struct state_without_assign {
  std::span<float const> values() const;
};
struct policy_state_without_assign {
  using feedback_concept = gc::feedback_tag;
  static constexpr gc::feedback_id id = gc::feedback_id::residual;
  using state = state_without_assign;
  template <class C, gc::element T>
  std::size_t compress(C const&, state&, gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const;
};

struct state_not_default_constructible {
  explicit state_not_default_constructible(int);
  std::span<float const> values() const;
  void assign(std::span<float const>);
};
struct policy_bad_state_ctor {
  using feedback_concept = gc::feedback_tag;
  static constexpr gc::feedback_id id = gc::feedback_id::residual;
  using state = state_not_default_constructible;
  template <class C, gc::element T>
  std::size_t compress(C const&, state&, gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const;
};

struct policy_returns_void {
  using feedback_concept = gc::feedback_tag;
  static constexpr gc::feedback_id id = gc::feedback_id::residual;
  using state = good_state;
  template <class C, gc::element T>
  void compress(C const&, state&, gc::tensor_view<T const>, std::span<std::byte>,
                gc::codec_context const&) const;
};

struct policy_float_only {
  using feedback_concept = gc::feedback_tag;
  static constexpr gc::feedback_id id = gc::feedback_id::residual;
  using state = good_state;
  template <class C>
  std::size_t compress(C const&, state&, gc::tensor_view<float const>, std::span<std::byte>,
                       gc::codec_context const&) const;
};

struct policy_without_id {
  using feedback_concept = gc::feedback_tag;
  using state = good_state;
  template <class C, gc::element T>
  std::size_t compress(C const&, state&, gc::tensor_view<T const>, std::span<std::byte>,
                       gc::codec_context const&) const;
};

}  // namespace

// --- codec -----------------------------------------------------------------------------------

static_assert(gc::codec<complete_codec>);
static_assert(gc::codec<codec_with_derived_tag>);
static_assert(gc::codec_operations<complete_codec>);

static_assert(!gc::codec<untagged>);
static_assert(gc::codec_operations<untagged>);  // has the operations, is not a codec
static_assert(!gc::codec<wrong_tag>);
static_assert(!gc::codec<feedback_tag_as_codec_tag>);
static_assert(!gc::codec<no_unbiased>);
static_assert(!gc::codec<no_id>);
static_assert(gc::codec_operations<no_id>);
static_assert(!gc::codec<float_only_decompress_add>);
static_assert(!gc::codec_operations<float_only_decompress_add>);
static_assert(!gc::codec<compress_returns_int>);
static_assert(!gc::codec_operations<compress_returns_int>);
static_assert(!gc::codec<non_const_operations>);
static_assert(!gc::codec_operations<non_const_operations>);
static_assert(!gc::codec<int>);
static_assert(!gc::codec_operations<float>);

// The library's codecs.
static_assert(gc::codec<gc::identity_codec>);
static_assert(gc::codec<gc::fp16_codec>);
static_assert(gc::codec<gc::bf16_codec>);
static_assert(gc::codec<gc::int8_codec>);
static_assert(gc::codec<gc::onebit_codec>);
static_assert(gc::codec<gc::qsgd_codec>);
static_assert(gc::codec<gc::terngrad_codec>);
static_assert(gc::codec<gc::natural_codec>);
static_assert(gc::codec<gc::dithering_codec>);

// any_codec: the operations without the static traits.
static_assert(gc::codec_operations<gc::any_codec>);
static_assert(!gc::codec<gc::any_codec>);

// --- feedback_policy -------------------------------------------------------------------------

static_assert(gc::feedback_policy<complete_policy, gc::qsgd_codec>);
static_assert(gc::feedback_policy<complete_policy, untagged>);  // only codec_operations needed
static_assert(!gc::feedback_policy<complete_policy, int>);
static_assert(!gc::feedback_policy<complete_policy, float_only_decompress_add>);
static_assert(!gc::feedback_policy<one_phase_policy, gc::qsgd_codec>);
static_assert(!gc::feedback_policy<untagged_policy, gc::qsgd_codec>);
static_assert(!gc::feedback_policy<codec_tagged_policy, gc::qsgd_codec>);
static_assert(!gc::feedback_policy<policy_state_without_assign, gc::qsgd_codec>);
static_assert(!gc::feedback_policy<policy_bad_state_ctor, gc::qsgd_codec>);
static_assert(!gc::feedback_policy<policy_returns_void, gc::qsgd_codec>);
static_assert(!gc::feedback_policy<policy_float_only, gc::qsgd_codec>);
static_assert(!gc::feedback_policy<policy_without_id, gc::qsgd_codec>);

// The library's policies, with static and run-time codecs.
static_assert(gc::feedback_policy<gc::no_feedback, gc::qsgd_codec>);
static_assert(gc::feedback_policy<gc::residual_feedback, gc::onebit_codec>);
static_assert(gc::feedback_policy<gc::ef21_feedback, gc::int8_codec>);
static_assert(gc::feedback_policy<gc::no_feedback, gc::any_codec>);
static_assert(gc::feedback_policy<gc::residual_feedback, gc::any_codec>);
static_assert(gc::feedback_policy<gc::ef21_feedback, gc::any_codec>);
static_assert(gc::no_feedback::id == gc::feedback_id::none);
static_assert(gc::residual_feedback::id == gc::feedback_id::residual);
static_assert(gc::ef21_feedback::id == gc::feedback_id::ef21);

TEST_CASE("concepts: codec traits of the library's codecs", "[concepts]") {
  CHECK(gc::identity_codec::aggregation == gc::aggregation_kind::summable);
  CHECK(gc::fp16_codec::aggregation == gc::aggregation_kind::summable);
  CHECK(gc::bf16_codec::aggregation == gc::aggregation_kind::summable);
  CHECK(gc::qsgd_codec::aggregation == gc::aggregation_kind::gather);
  CHECK(gc::identity_codec::unbiased);
  CHECK(gc::qsgd_codec::unbiased);
  CHECK(gc::terngrad_codec::unbiased);
  CHECK(gc::natural_codec::unbiased);
  CHECK_FALSE(gc::onebit_codec::unbiased);
  CHECK_FALSE(gc::fp16_codec::unbiased);
  CHECK(gc::fp16_codec::id == gc::codec_id::fp16);
  CHECK(gc::bf16_codec::id == gc::codec_id::bf16);
  CHECK(std::string(gc::aggregation_name(gc::aggregation_kind::summable)) == "summable");
  CHECK(std::string(gc::aggregation_name(gc::aggregation_kind::shared_support)) ==
        "shared support");
  CHECK(std::string(gc::aggregation_name(gc::aggregation_kind::gather)) == "gather");
  CHECK(std::string(gc::aggregation_name(gc::aggregation_kind::low_rank)) == "low-rank");
  CHECK(std::string(gc::aggregation_name(static_cast<gc::aggregation_kind>(99))) == "unknown");
}
