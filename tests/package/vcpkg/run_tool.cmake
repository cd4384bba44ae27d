# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DTOOL=<tools/gradcomp/gradcomp-bench> -DEXPECTED_VERSION=x.y.z -DWORK=<scratch>
#       -P run_tool.cmake
#
# package.vcpkg_tool: the program that the replayed port (feature tool) copied to
# tools/gradcomp/ runs from there: --help prints its usage, and an fp16 run of 4096 synthetic
# values writes a --json report with the package's version and one fp16 row of two bytes a
# value plus a header (8192 < bytes <= 8448) and a relative L2 error in (0, 5e-4): fp16 rounds
# each value within 2^-11 of itself.

foreach(var IN ITEMS TOOL EXPECTED_VERSION WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_tool.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${TOOL}")
  message(FATAL_ERROR "no program at ${TOOL}")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

execute_process(COMMAND "${TOOL}" --help RESULT_VARIABLE status OUTPUT_VARIABLE help)
if(NOT status EQUAL 0 OR NOT help MATCHES "\nUsage: gradcomp-bench ")
  message(FATAL_ERROR "${TOOL} --help: status ${status}, no usage line:\n${help}")
endif()

execute_process(
  COMMAND "${TOOL}" --synthetic gauss --size 4096 --codec fp16 --threads 1 --no-timing
    --json "${WORK}/report.json"
  RESULT_VARIABLE status OUTPUT_VARIABLE table ERROR_VARIABLE err)
message("${table}${err}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${TOOL} on synthetic data failed (${status})")
endif()
file(READ "${WORK}/report.json" report)
string(JSON tool GET "${report}" tool)
string(JSON version GET "${report}" version)
string(JSON rows LENGTH "${report}" rows)
string(JSON codec GET "${report}" rows 0 codec)
string(JSON n GET "${report}" rows 0 n)
string(JSON bytes GET "${report}" rows 0 bytes)
string(JSON rel_l2 GET "${report}" rows 0 rel_l2)
set(problems "")
if(NOT tool STREQUAL "gradcomp-bench" OR NOT version STREQUAL EXPECTED_VERSION)
  list(APPEND problems "report of ${tool} ${version}, expected gradcomp-bench ${EXPECTED_VERSION}")
endif()
if(NOT rows EQUAL 1 OR NOT codec STREQUAL "fp16" OR NOT n EQUAL 4096)
  list(APPEND problems "expected one fp16 row of 4096 values: ${rows} rows, ${codec}, n ${n}")
endif()
if(bytes LESS_EQUAL 8192 OR bytes GREATER 8448)
  list(APPEND problems "fp16 packet of ${bytes} bytes for 4096 values")
endif()
# CMake has no floating point: rel_l2 as the report writes it, 0.000ddd or d.ddde-0N (N >= 5).
if(rel_l2 MATCHES "^0\\.000[0-4][0-9]*$" AND rel_l2 MATCHES "[1-9]")
elseif(rel_l2 MATCHES "^[1-9](\\.[0-9]+)?e-0[5-9]$")
else()
  list(APPEND problems "fp16 relative L2 error ${rel_l2}, expected in (0, 5e-4)")
endif()
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "package.vcpkg_tool:\n  ${text}")
endif()
message(STATUS "package.vcpkg_tool: ${TOOL} (${version}) ran: fp16, ${n} values, ${bytes} bytes, "
               "relative L2 error ${rel_l2}")
