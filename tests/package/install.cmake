# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DPREFIX=... [-DCONFIG=...] -DINCLUDEDIR=...
#       -DCMAKEDIR=... -DDOCDIR=... -DPKGCONFIGDIR=... -P install.cmake
#
# Installs the build tree into an empty PREFIX and checks the result: every public header of the
# source tree (.hpp and .cuh) is there, nothing else is under include/gradcomp, and the CMake
# package, gradcomp.pc and the licence are where docs/building.md says.

cmake_policy(VERSION 3.23)

foreach(var IN ITEMS BUILD_DIR SOURCE_DIR PREFIX INCLUDEDIR CMAKEDIR DOCDIR PKGCONFIGDIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${PREFIX}")
set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}" ${config_args}
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${result})")
endif()

set(problems "")
file(GLOB_RECURSE expected RELATIVE "${SOURCE_DIR}/include"
     "${SOURCE_DIR}/include/gradcomp/*.hpp" "${SOURCE_DIR}/include/gradcomp/*.cuh")
file(GLOB_RECURSE installed RELATIVE "${PREFIX}/${INCLUDEDIR}" "${PREFIX}/${INCLUDEDIR}/*")
foreach(header IN LISTS expected)
  if(NOT header IN_LIST installed)
    list(APPEND problems "missing header ${INCLUDEDIR}/${header}")
  endif()
endforeach()
foreach(file IN LISTS installed)
  if(NOT file IN_LIST expected)
    list(APPEND problems "unexpected file ${INCLUDEDIR}/${file}")
  endif()
endforeach()
if(NOT "gradcomp/gradcomp.hpp" IN_LIST expected)
  list(APPEND problems "the source tree has no include/gradcomp/gradcomp.hpp")
endif()

foreach(file IN ITEMS
    "${CMAKEDIR}/gradcompConfig.cmake"
    "${CMAKEDIR}/gradcompConfigVersion.cmake"
    "${CMAKEDIR}/gradcompTargets.cmake"
    "${CMAKEDIR}/gradcompCudaStandard.cmake"
    "${PKGCONFIGDIR}/gradcomp.pc"
    "${DOCDIR}/LICENSE")
  if(NOT EXISTS "${PREFIX}/${file}")
    list(APPEND problems "missing ${file}")
  endif()
endforeach()

list(LENGTH expected header_count)
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "install into ${PREFIX} is wrong:\n  ${text}")
endif()
message(STATUS "installed ${header_count} headers and the CMake package into ${PREFIX}")
