// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `make_feedback`: the error-feedback spec, parsed beside the policies it names
/// (feedback/policies.hpp, feedback/dgc.hpp). Grammar (core/spec.hpp):
///
///     none | residual | ef21 | dgc[:momentum=M,clip_norm=C]
///
/// "none" sends C(g); "residual" is EF-SGD (the residual e ← g + e − D(C(g + e))); "ef21" sends
/// compressed increments against a receiver-side estimate; "dgc" is Deep Gradient Compression's
/// momentum correction with momentum factor masking (momentum default 0.9, clip_norm default 0:
/// no clipping). Only "dgc" takes options; unknown names and options are `config_error`s.
/// The result is a `compressor` over an erased codec holding that policy, one alternative per
/// policy (`feedback_compressor`).

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/spec.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

GRADCOMP_NAMESPACE_BEGIN

/// A `compressor` over `any_codec` with the error-feedback policy of a spec.
using feedback_compressor =
    std::variant<compressor<any_codec, no_feedback>, compressor<any_codec, residual_feedback>,
                 compressor<any_codec, ef21_feedback>, compressor<any_codec, dgc_feedback>>;

/// The compressor of `codec` with the error feedback `spec` names (file comment).
[[nodiscard]] inline feedback_compressor make_feedback(std::string_view spec, any_codec codec) {
  std::string_view const name = spec.substr(0, spec.find(':'));
  bool const has_options = spec.find(':') != std::string_view::npos;
  if (name == "dgc") {
    float momentum = 0.9f;
    double clip = 0.0;
    if (has_options) {
      spec_options o(spec, "feedback");
      momentum = static_cast<float>(o.number("momentum", 0.9));
      clip = o.number("clip_norm", 0.0);
      o.finish();
    }
    return compressor<any_codec, dgc_feedback>(std::move(codec), dgc_feedback(momentum, clip));
  }
  if (has_options) {
    throw config_error("gradcomp: feedback '" + std::string(name) + "' takes no options, got '" +
                       std::string(spec) + "'");
  }
  if (name == "none") return compressor<any_codec, no_feedback>(std::move(codec));
  if (name == "residual") return compressor<any_codec, residual_feedback>(std::move(codec));
  if (name == "ef21") return compressor<any_codec, ef21_feedback>(std::move(codec));
  throw config_error("gradcomp: unknown error feedback '" + std::string(spec) +
                     "' (expected none, residual, ef21 or dgc[:momentum=M,clip_norm=C])");
}

/// The policy a `feedback_compressor` holds.
[[nodiscard]] inline feedback_id feedback_of(feedback_compressor const& c) noexcept {
  return std::visit([](auto const& x) { return std::remove_cvref_t<decltype(x)>::feedback_type::id; }, c);
}

GRADCOMP_NAMESPACE_END
