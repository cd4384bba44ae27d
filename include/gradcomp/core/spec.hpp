// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `spec_options`: the one parser of the text specs `name[:key=value[,key=value...]]` that name
/// a codec (`make_codec`), a controller (`make_controller`) or PowerSGD (`make_powersgd`).
///
/// Grammar: the name is everything before the first ':' and must not be empty; after the ':'
/// come one or more comma-separated `key=value` items with a non-empty key (the value may be
/// empty, and a converter then rejects it); a key may appear once. A spec without ':' has no
/// options; one that ends with ':' is an error. The builder then consumes each option once
/// (`number`, `count`, `choice`, `take`) and calls `finish`, which rejects every key left over.
/// Every error is a `config_error` whose message names the family ("codec", "controller",
/// "powersgd"), the bad key or value, and what was expected.

#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <charconv>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The options of one spec, each consumed at most once (see file comment).
class spec_options {
 public:
  /// Parses `spec`; `family` names what it specifies in error messages ("codec").
  /// @throws config_error for an empty name, a trailing ':', an item that is not key=value or
  ///         a key given twice.
  spec_options(std::string_view spec, std::string_view family) : family_(family), text_(spec) {
    auto const colon = spec.find(':');
    name_ = std::string(spec.substr(0, colon));
    if (name_.empty()) {
      throw config_error("gradcomp: " + family_ + " spec '" + text_ +
                         "' has an empty name; expected " + "name[:key=value[,key=value...]]");
    }
    if (colon == std::string_view::npos) return;
    std::string_view rest = spec.substr(colon + 1);
    if (rest.empty())
      throw config_error("gradcomp: " + family_ + " spec '" + text_ + "' ends with ':'");
    while (true) {
      std::string_view const item = rest.substr(0, rest.find(','));
      bool const last = item.size() == rest.size();
      rest = last ? std::string_view{} : rest.substr(item.size() + 1);
      auto const eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        throw config_error("gradcomp: " + family_ + " option '" + std::string(item) +
                           "' is not key=value");
      }
      std::string key(item.substr(0, eq));
      if (!opts_.emplace(key, std::string(item.substr(eq + 1))).second) {
        throw config_error("gradcomp: " + family_ + " option '" + key + "' given twice");
      }
      order_.push_back(std::move(key));
      if (last) break;
    }
  }

  /// The name (before the ':').
  [[nodiscard]] std::string const& name() const noexcept { return name_; }
  /// The whole spec as given.
  [[nodiscard]] std::string const& text() const noexcept { return text_; }
  /// True if `key` was given and not consumed yet.
  [[nodiscard]] bool has(std::string_view key) const { return opts_.find(key) != opts_.end(); }

  /// Consumes `key` and returns its text, or nothing when absent.
  std::optional<std::string> take(std::string_view key) {
    auto it = opts_.find(key);
    if (it == opts_.end()) return std::nullopt;
    std::string v = std::move(it->second);
    opts_.erase(it);
    return v;
  }
  /// Consumes `key` and returns its text, or `dflt` when absent.
  std::string take(std::string_view key, std::string_view dflt) {
    std::optional<std::string> v = take(key);
    return v ? std::move(*v) : std::string(dflt);
  }

  /// Consumes `key` as a number (`std::from_chars` of a double, whole text), or `dflt`.
  double number(std::string_view key, double dflt) {
    std::optional<std::string> const v = take(key);
    return v ? to_number(key, *v) : dflt;
  }
  /// Consumes `key` as an unsigned integer of at most `max`, or `dflt`.
  std::uint64_t count(std::string_view key, std::uint64_t dflt,
                      std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
    std::optional<std::string> const v = take(key);
    return v ? to_count(key, *v, max) : dflt;
  }
  /// Consumes `key` and returns the index of its value in `allowed`, or 0 when absent.
  unsigned choice(std::string_view key, std::initializer_list<std::string_view> allowed) {
    auto it = opts_.find(key);
    if (it == opts_.end()) return 0;
    unsigned i = 0;
    for (auto a : allowed) {
      if (it->second == a) {
        opts_.erase(it);
        return i;
      }
      ++i;
    }
    throw config_error("gradcomp: " + family_ + " option '" + std::string(key) +
                       "' must be one of " + join(allowed) + ", got '" + it->second + "'");
  }
  /// Every option not consumed yet, in the order given; consumes them all.
  std::vector<std::pair<std::string, std::string>> take_all() {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto const& k : order_) {
      auto it = opts_.find(k);
      if (it != opts_.end()) out.emplace_back(it->first, it->second);
    }
    opts_.clear();
    return out;
  }
  /// @throws config_error naming the first option not consumed (an unknown key), with the
  ///         keys the name takes when `expected` is given.
  void finish(std::initializer_list<std::string_view> expected = {}) const {
    if (opts_.empty()) return;
    std::string msg =
        "gradcomp: " + family_ + " '" + name_ + "' has no option '" + opts_.begin()->first + "'";
    if (expected.size() != 0) msg += " (expected " + join(expected) + ")";
    throw config_error(msg);
  }

  /// `v` as a number; `key` names it in the error.
  [[nodiscard]] double to_number(std::string_view key, std::string_view v) const {
    double out = 0.0;
    auto const [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (v.empty() || ec != std::errc{} || p != v.data() + v.size()) {
      throw config_error("gradcomp: " + family_ + " option '" + std::string(key) +
                         "' needs a number, got '" + std::string(v) + "'");
    }
    return out;
  }
  /// `v` as an unsigned integer of at most `max`; `key` names it in the error.
  [[nodiscard]] std::uint64_t to_count(
      std::string_view key, std::string_view v,
      std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) const {
    std::uint64_t out = 0;
    auto const [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (v.empty() || ec != std::errc{} || p != v.data() + v.size() || out > max) {
      throw config_error("gradcomp: " + family_ + " option '" + std::string(key) +
                         "' needs an unsigned integer" +
                         (max == std::numeric_limits<std::uint64_t>::max()
                              ? std::string()
                              : " of at most " + std::to_string(max)) +
                         ", got '" + std::string(v) + "'");
    }
    return out;
  }

 private:
  static std::string join(std::initializer_list<std::string_view> list) {
    std::string out;
    for (auto a : list) out += (out.empty() ? "" : ", ") + std::string(a);
    return out;
  }

  std::string family_, text_, name_;
  std::map<std::string, std::string, std::less<>> opts_;
  std::vector<std::string> order_;
};

GRADCOMP_NAMESPACE_END
