# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DDOXYGEN=<doxygen> -DSOURCE_DIR=<repo> -DOUT=<dir> -P doxygen.cmake
#
# package.doxygen: docs/Doxyfile, the one command users run (`doxygen docs/Doxyfile` from the
# repository root), with the output sent to OUT. The Doxyfile makes every warning an error;
# this also fails when doxygen printed a warning at all or wrote no index.html.

cmake_policy(VERSION 3.23)
foreach(var IN ITEMS DOXYGEN SOURCE_DIR OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "doxygen.cmake: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
file(READ "${SOURCE_DIR}/docs/Doxyfile" config)
file(WRITE "${OUT}/Doxyfile" "${config}\nOUTPUT_DIRECTORY = \"${OUT}\"\n")
execute_process(COMMAND "${DOXYGEN}" "${OUT}/Doxyfile"
  WORKING_DIRECTORY "${SOURCE_DIR}"
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT result EQUAL 0 OR err MATCHES "warning|error")
  message(FATAL_ERROR "doxygen reported problems (exit status ${result})")
endif()
if(NOT EXISTS "${OUT}/html/index.html")
  message(FATAL_ERROR "doxygen wrote no ${OUT}/html/index.html")
endif()
message(STATUS "API reference: ${OUT}/html/index.html")
