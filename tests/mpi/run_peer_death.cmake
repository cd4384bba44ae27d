# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DMPIEXEC=... -DFLAGS=... -DPROGRAM=... -DMODE=<abort|survive> -P run_peer_death.cmake
#
# Runs peer_death/peer_death.cpp on 3 ranks (rank 1 dies) and checks what Open MPI does:
#   abort    default policy: mpirun ends the job (non-zero status) within seconds, no hang
#   survive  --mca orte_abort_on_non_zero_status 0: both survivors report a comm_error that
#            says the all-reduce timed out (2 s), then abort the job themselves.
# Either way the whole run must end well within 60 s.

include("${CMAKE_CURRENT_LIST_DIR}/mpi_job.cmake")
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
if(MODE STREQUAL "survive")
  list(APPEND flags --mca orte_abort_on_non_zero_status 0)
endif()
gradcomp_mpi_job(3 2000)
message(STATUS "exit status: ${rc}, ${elapsed} s\n${out}\n${err}")

if(rc EQUAL 0 OR rc MATCHES "timeout")
  message(FATAL_ERROR "expected the job to end with a non-zero status, got '${rc}'")
endif()
if(elapsed GREATER 60)
  message(FATAL_ERROR "the job took ${elapsed} s to end")
endif()
if(out MATCHES "completed without rank 1")
  message(FATAL_ERROR "a collective completed without the dead rank")
endif()
if(MODE STREQUAL "survive")
  foreach(r IN ITEMS 0 2)
    if(NOT out MATCHES "survivor ${r}: comm_error: [^\n]*timed out")
      message(FATAL_ERROR "survivor ${r} did not report a timed-out comm_error")
    endif()
  endforeach()
endif()
