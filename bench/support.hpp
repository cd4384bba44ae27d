// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the benchmark programs that do not use Google Benchmark (the collective and MPI ones)
// share: a walk over "--option value" pairs, comma-separated lists, and the test gradient.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace gradcomp_bench {

/// "a,b,c" -> {"a", "b", "c"}; an empty string gives no items.
inline std::vector<std::string> split_list(std::string const& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < s.size()) {
    std::size_t const comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

/// Walks argv: `while (in.next()) { if (in.option() == "--n") n = std::stoi(in.value()); }`.
/// `value()` takes the argument after the option, or exits with status 2 saying it is missing.
class arg_reader {
 public:
  arg_reader(int argc, char** argv, char const* program) : argc_(argc), argv_(argv), program_(program) {}

  bool next() {
    if (++i_ >= argc_) return false;
    option_ = argv_[i_];
    return true;
  }
  [[nodiscard]] std::string const& option() const noexcept { return option_; }
  std::string value() {
    if (i_ + 1 >= argc_) {
      std::fprintf(stderr, "%s: %s needs a value\n", program_, option_.c_str());
      std::exit(2);
    }
    return argv_[++i_];
  }

 private:
  int argc_;
  char** argv_;
  char const* program_;
  int i_ = 0;
  std::string option_;
};

/// Rank `rank`'s gradient of `n` elements: N(0, 1e-6) values from a seed per rank.
inline std::vector<float> test_gradient(std::size_t n, int rank) {
  std::vector<float> g(n);
  std::mt19937_64 rng(0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& x : g) x = d(rng) * 1e-3f;
  return g;
}

}  // namespace gradcomp_bench
