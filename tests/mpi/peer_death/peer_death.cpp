// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// What happens to the MPI adapter when a peer process dies. Run by run_peer_death.cmake:
//   mpirun -n 3 gradcomp_mpi_peer_death <timeout_ms>
// Rank 1 kills itself (SIGKILL) after a first barrier; ranks 0 and 2 then all-reduce, which can
// never complete. Under Open MPI's default policy mpirun terminates the whole job as soon as
// it notices the dead process. With `--mca orte_abort_on_non_zero_status 0` the survivors keep
// running: the adapter's timeout turns the wait into a comm_error, which this program prints
// ("survivor N: comm_error: ...") before it calls MPI_Abort, because MPI_Finalize would wait
// for the dead rank forever.

#include <gradcomp/comm/mpi.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  gradcomp::mpi_environment env(&argc, &argv);
  gradcomp::mpi_options o;
  o.timeout = std::chrono::milliseconds(argc > 1 ? std::atoi(argv[1]) : 2000);
  gradcomp::mpi_communicator c(MPI_COMM_WORLD, o);
  c.barrier();
  if (c.rank() == 1) std::raise(SIGKILL);
  std::vector<float> v(1024, 1.0f);
  try {
    c.all_reduce(std::as_writable_bytes(std::span(v)), gradcomp::comm_type::f32,
                 gradcomp::reduce_op::sum);
    std::printf("survivor %d: the all-reduce completed without rank 1\n", c.rank());
    return 1;
  } catch (gradcomp::comm_error const& e) {
    std::printf("survivor %d: comm_error: %s\n", c.rank(), e.what());
    std::fflush(stdout);
  }
  // MPI_Abort kills every process of the job: give the other survivor, whose timeout started
  // at about the same moment, one timeout's worth of time to report first.
  std::this_thread::sleep_for(o.timeout);
  MPI_Abort(MPI_COMM_WORLD, 42);
  return 2;
}
