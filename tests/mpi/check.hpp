// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small test harness for programs run under mpirun (Catch2 does not know about ranks).
//
//   MPI_TEST(name) { ... }               registers a test; every rank runs every test in order
//   MPI_CHECK(cond)                      records a failure (file, line, rank) and carries on
//   MPI_CHECK_THROWS_AS(expr, type)      expr must throw `type`
//   MPI_CHECK_THROWS_WITH(expr, type, s) ... and its what() must contain s
//
// After each test the ranks agree (MPI_Allreduce on MPI_COMM_WORLD) on whether any of them
// failed; rank 0 prints one line per test, every failing rank prints its failures. main.cpp
// exits non-zero when a test failed on any rank.

#include <cstdio>
#include <string>
#include <vector>

namespace mpi_tests {

struct test_case {
  char const* name;
  void (*fn)();
};

inline std::vector<test_case>& registry() {
  static std::vector<test_case> r;
  return r;
}

inline bool add(char const* name, void (*fn)()) {
  registry().push_back({name, fn});
  return true;
}

inline std::vector<std::string>& failures() {
  static std::vector<std::string> f;
  return f;
}

inline void fail(char const* file, int line, std::string const& what) {
  failures().push_back(std::string(file) + ":" + std::to_string(line) + ": " + what);
}

}  // namespace mpi_tests

#define MPI_TEST(name)                                                                 \
  static void name();                                                                  \
  [[maybe_unused]] static bool const name##_registered = mpi_tests::add(#name, &name); \
  static void name()

#define MPI_CHECK(...)                                                                             \
  do {                                                                                             \
    if (!(__VA_ARGS__)) mpi_tests::fail(__FILE__, __LINE__, "MPI_CHECK(" #__VA_ARGS__ ") failed"); \
  } while (false)

#define MPI_CHECK_THROWS_WITH(expr, type, text)                                                    \
  do {                                                                                             \
    bool mpi_check_thrown_ = false;                                                                \
    try {                                                                                          \
      expr;                                                                                        \
    } catch (type const& e) {                                                                      \
      mpi_check_thrown_ = true;                                                                    \
      if (std::string(e.what()).find(text) == std::string::npos) {                                 \
        mpi_tests::fail(__FILE__, __LINE__,                                                        \
                        std::string(#expr " threw '") + e.what() + "', which does not contain '" + \
                            (text) + "'");                                                         \
      }                                                                                            \
    } catch (std::exception const& e) {                                                            \
      mpi_check_thrown_ = true;                                                                    \
      mpi_tests::fail(__FILE__, __LINE__,                                                          \
                      std::string(#expr " threw another exception: ") + e.what());                 \
    }                                                                                              \
    if (!mpi_check_thrown_) mpi_tests::fail(__FILE__, __LINE__, #expr " did not throw " #type);    \
  } while (false)

#define MPI_CHECK_THROWS_AS(expr, type) MPI_CHECK_THROWS_WITH(expr, type, "")
