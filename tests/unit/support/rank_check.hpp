// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Checks for code that runs on rank threads (run_in_process): Catch2 v2's assertion macros are
// not thread-safe, so a rank thread must not use REQUIRE/CHECK. RANK_REQUIRE throws a
// std::logic_error naming the condition, the file, the line and the rank instead; the
// in-process runner rethrows the first rank's error on the calling thread, where
// `REQUIRE_NOTHROW(run_in_process(...))` reports it.

#include <stdexcept>
#include <string>

#define RANK_REQUIRE(...)                                                                       \
  do {                                                                                          \
    if (!(__VA_ARGS__)) {                                                                           \
      throw std::logic_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) +           \
                             ": RANK_REQUIRE(" #__VA_ARGS__ ") failed");                               \
    }                                                                                           \
  } while (false)
