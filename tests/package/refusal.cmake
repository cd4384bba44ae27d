# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DPREFIX=<installed prefix> -DWORK=<scratch> -DVERSION=x.y.z -DGENERATOR=...
#       -DCXX=... -DCASES=<case>... -P refusal.cmake
#
# Requests the installed package cannot satisfy, each configuring refusal/ and expecting the
# configure to fail with the message that says why. CASES picks from:
#
#   older_minor    find_package(gradcomp 0.(y-1)): before 1.0 the minor version breaks the API,
#                  so the package is SameMinorVersion-compatible and refuses (needs y > 0); from
#                  1.0 on, SameMajorVersion, the request is (x-1).0
#   newer_minor    find_package(gradcomp x.(y+1)): a newer minor version than installed
#   blas_missing   COMPONENTS blas where no CBLAS can be found (the searches for cblas.h and the
#                  library are rerooted into an empty directory): gradcomp_NOT_FOUND_MESSAGE
#                  names what is missing
#   torch_missing  COMPONENTS torch where torch's CMake package cannot be found: the message
#                  says to put torch.utils.cmake_prefix_path on CMAKE_PREFIX_PATH
#   unknown        COMPONENTS nosuch: the message lists the components that exist

cmake_policy(VERSION 3.23)
foreach(var IN ITEMS PREFIX WORK VERSION GENERATOR CXX CASES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "refusal.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT VERSION MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$")
  message(FATAL_ERROR "VERSION='${VERSION}' is not x.y.z")
endif()
set(major ${CMAKE_MATCH_1})
set(minor ${CMAKE_MATCH_2})
math(EXPR older "${minor} - 1")
math(EXPR newer "${minor} + 1")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/empty")

foreach(case IN LISTS CASES)
  set(options "")
  if(case STREQUAL "older_minor")
    if(NOT major EQUAL 0)
      # From 1.0 on the package is SameMajorVersion: the older major version is what it refuses.
      math(EXPR older_major "${major} - 1")
      set(options "-DREQUEST_VERSION=${older_major}.0")
      set(expect "compatible with requested version \"${older_major}\\.0\".*version: ${VERSION}")
    elseif(minor EQUAL 0)
      message(STATUS "${case}: skipped, the version is ${VERSION}")
      continue()
    else()
      set(options "-DREQUEST_VERSION=${major}.${older}")
      set(expect "compatible with requested version \"${major}\\.${older}\".*version: ${VERSION}")
    endif()
  elseif(case STREQUAL "newer_minor")
    set(options "-DREQUEST_VERSION=${major}.${newer}")
    set(expect "compatible with requested version \"${major}\\.${newer}\".*version: ${VERSION}")
  elseif(case STREQUAL "blas_missing")
    set(options -DREQUEST_COMPONENTS=blas "-DCMAKE_FIND_ROOT_PATH=${WORK}/empty"
                -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY)
    set(expect "Reason given by package:.*required components are missing:.*gradcomp::blas needs a CBLAS: cblas\\.h.*libopenblas")
  elseif(case STREQUAL "torch_missing")
    set(options -DREQUEST_COMPONENTS=torch)
    set(expect "Reason given by package:.*required components are missing:.*gradcomp::torch needs torch's CMake package.*torch\\.utils\\.cmake_prefix_path")
  elseif(case STREQUAL "unknown")
    set(options -DREQUEST_COMPONENTS=blas,nosuch)
    set(expect "gradcomp has no component 'nosuch' \\(it has cuda, mpi, nccl, blas, torch")
  else()
    message(FATAL_ERROR "unknown case '${case}'")
  endif()
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/refusal" -B "${WORK}/${case}"
      -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${PREFIX}" ${options}
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX REPLACE "[ \t\r\n]+" " " text "${out}${err}")
  if(result EQUAL 0)
    message(FATAL_ERROR "${case}: the configure succeeded; it should have failed:\n${out}${err}")
  endif()
  if(NOT text MATCHES "${expect}")
    message(FATAL_ERROR "${case}: the configure failed, but without the expected message "
                        "(regex: ${expect}):\n${out}${err}")
  endif()
  message(STATUS "${case}: refused as expected")
endforeach()
