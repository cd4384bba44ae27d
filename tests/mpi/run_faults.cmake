# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DMPIEXEC=... -DFLAGS=... -DPROGRAM=... -DFAULT=<stall|drop> -P run_faults.cmake
#
# Runs faults/faults.cpp on 3 ranks with Open MPI's survive policy, one job per collective, and
# checks the line each rank prints ("rank R <collective> <fault>: <how> after N ms; state ..."):
#   stall  rank 1 stalls past the timeout: all three ranks end in comm_error, state unchanged;
#   drop   rank 1 is killed: both survivors end in comm_error with their state unchanged.
# Each rank must report within a few timeouts, and every job end within 60 s (no hang).

include("${CMAKE_CURRENT_LIST_DIR}/mpi_job.cmake")
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
list(APPEND flags --mca orte_abort_on_non_zero_status 0)
set(timeout_ms 1500)
set(collectives "all_reduce_compressed(gather)" "all_reduce_compressed(summable)" "all_reduce_two_way"
                "gradient_pipeline")

function(run_job args expect_ranks expect_collectives)
  gradcomp_mpi_job(3 ${args})
  message(STATUS "${FAULT} ${args}: exit status ${rc}, ${elapsed} s\n${out}")
  if(rc MATCHES "timeout" OR elapsed GREATER 60)
    message(FATAL_ERROR "the job did not end in time (${elapsed} s)\n${err}")
  endif()
  foreach(c IN LISTS expect_collectives)
    string(REPLACE "(" "\\(" c_re "${c}")
    string(REPLACE ")" "\\)" c_re "${c_re}")
    foreach(r IN LISTS expect_ranks)
      set(line_re "rank ${r} ${c_re} ${FAULT}: ([^\n]*)")
      if(NOT out MATCHES "${line_re}")
        message(FATAL_ERROR "rank ${r} did not report ${c} (${FAULT})\n${err}")
      endif()
      set(line "${CMAKE_MATCH_1}")
      if(NOT line MATCHES "^comm_error after ([0-9]+) ms; state unchanged")
        message(FATAL_ERROR "rank ${r}, ${c}, ${FAULT}: expected comm_error with the state unchanged, got '${line}'")
      endif()
      math(EXPR bound "${timeout_ms} * 3 + 5000")
      if(CMAKE_MATCH_1 GREATER bound)
        message(FATAL_ERROR "rank ${r}, ${c}, ${FAULT}: took ${CMAKE_MATCH_1} ms")
      endif()
    endforeach()
  endforeach()
endfunction()

if(FAULT STREQUAL "stall")
  set(ranks "0;1;2")
else()
  set(ranks "0;2")
endif()
set(i 0)
foreach(c IN LISTS collectives)
  run_job("${FAULT};${timeout_ms};${i}" "${ranks}" "${c}")
  math(EXPR i "${i} + 1")
endforeach()
