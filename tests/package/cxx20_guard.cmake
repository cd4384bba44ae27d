# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DINCLUDE_DIR=<installed include dir> -DCONSUMER=<consumer.cpp> -DCOMPILERS=<c++>...
#       -P cxx20_guard.cmake
#
# package.cxx20_guard: compiles the consumer (which includes <gradcomp/gradcomp.hpp>) with
# -std=c++17 and -std=gnu++17 under each compiler and expects the compile to fail with
# config.hpp's guard as the first error, not with an error from deep inside the concepts
# (-Wfatal-errors stops at that first error, which keeps the test fast). That C++20 compiles,
# so the guard does not fire where it should not, is what every other consumer test shows.

cmake_policy(VERSION 3.23)
foreach(var IN ITEMS INCLUDE_DIR CONSUMER COMPILERS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "cxx20_guard.cmake: -D${var}=... is required")
  endif()
endforeach()

set(guard "gradcomp needs C\\+\\+20: compile with -std=c\\+\\+20 or later")
foreach(cxx IN LISTS COMPILERS)
  foreach(std IN ITEMS c++17 gnu++17)
    execute_process(
      COMMAND "${cxx}" -std=${std} -Wfatal-errors "-I${INCLUDE_DIR}" -fsyntax-only "${CONSUMER}"
      RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(result EQUAL 0)
      message(FATAL_ERROR "${cxx} -std=${std} compiled the consumer; it should have failed")
    endif()
    string(REGEX MATCH "[^\n]*error[^\n]*" first "${err}")
    if(NOT first MATCHES "gradcomp/config\\.hpp:[0-9]+:.*${guard}")
      message(FATAL_ERROR "${cxx} -std=${std}: the first error is not config.hpp's guard but\n"
                          "  ${first}\n${err}")
    endif()
    message(STATUS "${cxx} -std=${std}: ${first}")
  endforeach()
endforeach()
