// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Drop and stall faults over MPI, one mpirun per case (run_faults.cmake):
//   mpirun -n 3 gradcomp_mpi_faults stall <timeout_ms>            every collective, one by one
//   mpirun -n 3 gradcomp_mpi_faults drop <timeout_ms> <subject>    one collective (0..3)
// Rank 1 misbehaves at its second operation of the step (the payload after the agreement
// round): `stall` sleeps twice the timeout before posting it, `drop` kills the process
// (SIGKILL; the job must run with Open MPI's `--mca orte_abort_on_non_zero_status 0`, as in
// the peer_death survive test). Each rank prints one line per case:
//   rank R <collective> <fault>: <comm_error|format_error|ok|...> after N ms; state
//   unchanged|CHANGED; retry ...
// A stalled rank survives, so after the failed step every rank retries it on a fresh
// communicator and compares with a clean step ("retry bit-identical"). The program ends with
// MPI_Abort: a communicator broken by a timeout may hold operations that MPI_Finalize would
// wait for forever.

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
  std::string retry = "n/a (a rank is gone)";
  if (!drop) {
    gc::mpi_communicator c1(MPI_COMM_WORLD, clean);
    gc::bytes const again = model.step(c1, 1);
    retry = again == p.expect && model.state() == p.expect_state ? "bit-identical" : "DIFFERS";
  }
  std::printf("rank %d %s %s: %s after %.0f ms; state %s; retry %s\n", rank, which_name(w),
              drop ? "drop" : "stall", o.how.c_str(), o.ms, unchanged ? "unchanged" : "CHANGED",
              retry.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  gc::mpi_environment env(&argc, &argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s stall|drop <timeout_ms> [subject 0..3]\n", argv[0]);
    return 2;
  }
  bool const drop = std::strcmp(argv[1], "drop") == 0;
  std::chrono::milliseconds const timeout(std::atoi(argv[2]));
  if (drop) {
    one_case(all_subjects[argc > 3 ? std::atoi(argv[3]) % 4 : 0], true, timeout);
    // The survivors' timeouts started together: give the other one time to report.
    std::this_thread::sleep_for(timeout);
  } else {
    for (which w : all_subjects) one_case(w, false, timeout);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Abort(MPI_COMM_WORLD, 42);
  return 2;
}
