// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Drop and stall faults over MPI, one mpirun per case (run_faults.cmake):
//   mpirun -n 3 gradcomp_mpi_faults stall|drop <timeout_ms> <subject 0..3>
// Rank 1 misbehaves at its second operation of the step (the payload after the agreement
// round): `stall` sleeps twice the timeout before posting it, `drop` kills the process
// (SIGKILL; the job must run with Open MPI's `--mca orte_abort_on_non_zero_status 0`, as in
// the peer_death survive test). Each rank still alive prints one line:
//   rank R <collective> <fault>: <comm_error|format_error|ok|...> after N ms; state
//   unchanged|CHANGED
// and makes no further MPI call but MPI_Abort: operations of a communicator broken by a
// timeout cannot be withdrawn and may still complete — into buffers the failed step has freed
// — when MPI next makes progress, so a process must not go on using MPI (comm/mpi.hpp). The
// retry of a failed step is tested on in-process ranks (the fault matrix) and, for failures
// that leave the communicator usable, in the MPI runner (test_faults_mpi.cpp).

#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/mpi.hpp>

#include "../faults_support.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

using namespace mpi_faults;

namespace {

struct outcome {
  std::string how = "ok";
  double ms = 0.0;
};

template <class Comm>
outcome run_step(rank_model& m, Comm& c, int step) {
  outcome o;
  auto const t0 = std::chrono::steady_clock::now();
  try {
    (void)m.step(c, step);
  } catch (gc::format_error const&) {
    o.how = "format_error";
  } catch (gc::comm_error const&) {
    o.how = "comm_error";
  } catch (gc::config_error const& e) {
    o.how = std::string("config_error (") + e.what() + ")";
  } catch (std::exception const& e) {
    o.how = std::string("other exception (") + e.what() + ")";
  }
  o.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

void one_case(which w, bool drop, std::chrono::milliseconds timeout) {
  gc::mpi_options clean;
  clean.timeout = std::chrono::seconds(60);
  gc::mpi_communicator c0(MPI_COMM_WORLD, clean);
  int const rank = c0.rank();
  prepared p = prepare(w, false, c0);
  rank_model& model = p.model;

  gc::mpi_options short_timeout;
  short_timeout.timeout = timeout;
  gc::mpi_communicator cf(MPI_COMM_WORLD, short_timeout);
  gc::fault f;
  f.rank = 1;
  f.index = 1;
  if (drop) {
    f.kind = gc::fault_kind::drop;
  } else {
    f.kind = gc::fault_kind::stall;
    f.duration = 2 * timeout;
  }
  gc::fault_plan plan{{f}, [](int) { std::raise(SIGKILL); }};
  gc::fault_injecting_communicator<gc::mpi_communicator&> fc(cf, plan);
  outcome const o = run_step(model, fc, 1);
  bool const unchanged = model.state() == p.before;
  std::printf("rank %d %s %s: %s after %.0f ms; state %s\n", rank, which_name(w),
              drop ? "drop" : "stall", o.how.c_str(), o.ms, unchanged ? "unchanged" : "CHANGED");
  std::fflush(stdout);
  // No MPI call but the abort (not even the communicators' destructors). The others end at
  // about the same time (the stalled rank a stall and a timeout later): let them report first.
  std::this_thread::sleep_for(drop ? timeout : 4 * timeout);
  MPI_Abort(MPI_COMM_WORLD, 42);
}

}  // namespace

int main(int argc, char** argv) {
  gc::mpi_environment env(&argc, &argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s stall|drop <timeout_ms> <subject 0..3>\n", argv[0]);
    return 2;
  }
  bool const drop = std::strcmp(argv[1], "drop") == 0;
  std::chrono::milliseconds const timeout(std::atoi(argv[2]));
  one_case(all_subjects[std::atoi(argv[3]) % 4], drop, timeout);  // ends the job
  return 2;
}
