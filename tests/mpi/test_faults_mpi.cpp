// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// Injected faults over MPI that leave the communicator usable (faults_support.hpp has the
// collectives): a payload corrupted by rank 1, in the bytes it sends or in those it received,
// with the checksum option on, must fail the step on every rank (format_error or comm_error)
// with every rank's state as before, and the retry on the same communicator must give the
// clean step's result bit for bit; a delay within the timeout must change nothing. Drop and
// stall, which break the communicator, run as separate jobs (faults/faults.cpp).

#include <gradcomp/comm/fault.hpp>
#include <gradcomp/comm/mpi.hpp>

#include "check.hpp"
#include "faults_support.hpp"

#include <chrono>
#include <string>

using namespace mpi_faults;
using namespace std::chrono_literals;

namespace {

gc::mpi_options options() {
  gc::mpi_options o;
  o.timeout = 30s;  // nothing here should wait for it
  return o;
}

// Step 1 of `w` under `f` (on rank 1) after a clean step 0; returns how it ended on this rank
// ("ok", "failed" for comm_error / format_error, or the unexpected exception), and checks the
// state and the retry.
std::string fault_case(which w, gc::fault f, bool checksum) {
  gc::mpi_communicator comm(MPI_COMM_WORLD, options());
  prepared p = prepare(w, checksum, comm);
  rank_model& model = p.model;
  std::string how = "ok";
  bytes got;
  {
    gc::fault_injecting_communicator<gc::mpi_communicator&> fc(comm, gc::fault_plan{{f}, {}});
    try {
      got = model.step(fc, 1);
    } catch (gc::format_error const&) {
      how = "failed";
    } catch (gc::comm_error const&) {
      how = "failed";
    } catch (std::exception const& e) {
      how = std::string("unexpected: ") + e.what();
    }
  }
  if (how == "ok") {
    MPI_CHECK(got == p.expect);
    MPI_CHECK(model.state() == p.expect_state);
    return how;
  }
  MPI_CHECK(model.state() == p.before);
  bytes const again = model.step(comm, 1);  // the communicator is still usable
  MPI_CHECK(again == p.expect);
  MPI_CHECK(model.state() == p.expect_state);
  return how;
}

gc::fault corrupt(which w, gc::fault_side side) {
  gc::fault f;
  f.kind = gc::fault_kind::corrupt;
  f.rank = 1;
  f.of = payload_op(w);
  f.index = 0;
  f.side = side;
  f.flips = 4;
  f.byte = 13;
  f.mask = 0x40;
  return f;
}

}  // namespace

MPI_TEST(faults_corrupted_payload_fails_every_rank) {
  for (which w : all_subjects) {
    for (gc::fault_side side : {gc::fault_side::send, gc::fault_side::receive}) {
      std::string const how = fault_case(w, corrupt(w, side), true);
      if (how != "failed") {
        mpi_tests::fail(__FILE__, __LINE__,
                        std::string(which_name(w)) +
                            (side == gc::fault_side::send ? " (send side)" : " (receive side)") +
                            ": expected the step to fail, it ended " + how);
      }
    }
  }
}

MPI_TEST(faults_delay_within_timeout_changes_nothing) {
  for (which w : all_subjects) {
    gc::fault f;
    f.kind = gc::fault_kind::delay;
    f.rank = 1;
    f.index = 1;
    f.duration = 50ms;
    std::string const how = fault_case(w, f, false);
    if (how != "ok")
      mpi_tests::fail(__FILE__, __LINE__,
                      std::string(which_name(w)) + ": a delay made the step end " + how);
  }
}
