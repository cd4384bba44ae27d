# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DMPIEXEC=... -DFLAGS=... -DPROGRAM=... -DFAULT=<stall|drop> -P run_faults.cmake
#
# Runs faults/faults.cpp on 3 ranks with Open MPI's survive policy and checks each line it
# prints ("rank R <collective> <fault>: <how> after N ms; state ...; retry ..."):
#   stall  one job, every collective in turn: all three ranks end in comm_error with their state
#          unchanged, and the retry on a fresh communicator is bit-identical;
#   drop   one job per collective (rank 1 killed): both survivors end in comm_error with their
#          state unchanged, within the timeout plus slack.
# Every job must end within 60 s (no hang).

separate_arguments(flags UNIX_COMMAND "${FLAGS}")
list(APPEND flags --mca orte_abort_on_non_zero_status 0)
set(timeout_ms 1500)
set(collectives "all_reduce_compressed(gather)" "all_reduce_compressed(summable)" "all_reduce_two_way"
                "gradient_pipeline")

function(run_job args expect_ranks expect_collectives)
  string(TIMESTAMP start "%s")
  execute_process(
    COMMAND "${MPIEXEC}" ${flags} -n 3 "${PROGRAM}" ${args}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err
    TIMEOUT 90)
  string(TIMESTAMP stop "%s")
  math(EXPR elapsed "${stop} - ${start}")
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
      if(FAULT STREQUAL "stall" AND NOT line MATCHES "retry bit-identical")
        message(FATAL_ERROR "rank ${r}, ${c}: the retry was not bit-identical: '${line}'")
      endif()
    endforeach()
  endforeach()
endfunction()

if(FAULT STREQUAL "stall")
  run_job("stall;${timeout_ms}" "0;1;2" "${collectives}")
else()
  set(i 0)
  foreach(c IN LISTS collectives)
    run_job("drop;${timeout_ms};${i}" "0;2" "${c}")
    math(EXPR i "${i} + 1")
  endforeach()
endif()
