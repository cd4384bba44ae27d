// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `make_codec_spec`: what a codec spec names, decided in one place. A spec names either a
/// stateless codec, erased as `any_codec` (`make_codec`: "topk:ratio=0.01", "int8", ...), or
/// PowerSGD ("powersgd[:rank=R,...]", `make_powersgd`), which keeps per-tensor state and needs
/// each tensor's matrix shape and so is not an `any_codec`: the result carries its options.
/// Everything that takes a codec spec from a user (the pipeline, the Python extension) asks
/// this function which of the two it is, rather than testing the family name itself.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <variant>

GRADCOMP_NAMESPACE_BEGIN

/// What a codec spec names: a stateless codec or PowerSGD's options.
using codec_spec = std::variant<any_codec, powersgd_options>;

/// Parses `spec`: the family "powersgd" gives `make_powersgd(spec).options()`, every other
/// family `make_codec(spec)`. Errors are those parsers' (`config_error` naming the family, the
/// key and what was expected). A low-rank `any_codec` cannot come out of `make_codec`; it is
/// refused here too, so that the two alternatives never overlap.
[[nodiscard]] inline codec_spec make_codec_spec(std::string_view spec) {
  if (spec.substr(0, spec.find(':')) == "powersgd") return make_powersgd(spec).options();
  any_codec c = make_codec(spec);
  if (c.aggregation() == aggregation_kind::low_rank) {
    throw config_error("gradcomp: codec spec '" + std::string(spec) +
                       "' names a low-rank codec; low-rank codecs are configured by a powersgd spec");
  }
  return c;
}

/// Whether `spec` (a result of `make_codec_spec`) names PowerSGD.
[[nodiscard]] inline bool names_low_rank(codec_spec const& spec) noexcept {
  return std::holds_alternative<powersgd_options>(spec);
}

GRADCOMP_NAMESPACE_END
