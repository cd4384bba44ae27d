// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Runner of the MPI tests (check.hpp). Usage: mpirun -n N gradcomp_mpi_tests [name...]
// (no names: every test). Exit status 0 when every test passed on every rank.

#include <gradcomp/comm/mpi.hpp>

#include "check.hpp"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  gradcomp::mpi_environment env(&argc, &argv, gradcomp::mpi_threading::multiple);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0) {
    std::printf("gradcomp MPI tests on %d ranks (thread level %d)\n", size, env.provided());
  }
  int failed_tests = 0;
  int run = 0;
  for (auto const& t : mpi_tests::registry()) {
    if (argc > 1) {
      bool wanted = false;
      for (int i = 1; i < argc; ++i) wanted = wanted || std::strcmp(argv[i], t.name) == 0;
      if (!wanted) continue;
    }
    ++run;
    mpi_tests::failures().clear();
    try {
      t.fn();
    } catch (std::exception const& e) {
      mpi_tests::fail(__FILE__, __LINE__, std::string("unexpected exception: ") + e.what());
    } catch (...) {
      mpi_tests::fail(__FILE__, __LINE__, "unexpected exception of unknown type");
    }
    int const mine = mpi_tests::failures().empty() ? 0 : 1;
    int any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    for (auto const& f : mpi_tests::failures()) {
      std::fprintf(stderr, "FAILED %s on rank %d/%d: %s\n", t.name, rank, size, f.c_str());
    }
    std::fflush(stderr);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("%-44s %s\n", t.name, any != 0 ? "FAILED" : "passed");
      std::fflush(stdout);
    }
    failed_tests += any;
  }
  if (rank == 0) std::printf("%d of %d tests failed on %d ranks\n", failed_tests, run, size);
  return failed_tests == 0 && run > 0 ? 0 : 1;
}
