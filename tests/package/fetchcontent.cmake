# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DSOURCE_DIR=<repo> -DWORK=<scratch> -DVERSION=x.y.z -DGENERATOR=... -DCXX=...
#       [-DMAKE_PROGRAM=...] -P fetchcontent.cmake
#
# package.fetchcontent: packs this checkout the way a release archive holds it
# (gradcomp-x.y.z/ with the build files, headers and licence), then builds and runs
# fetchcontent/ against that archive through a file:// URL with its SHA256.

cmake_policy(VERSION 3.23)
foreach(var IN ITEMS SOURCE_DIR WORK VERSION GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "fetchcontent.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
set(stage "${WORK}/stage/gradcomp-${VERSION}")
file(MAKE_DIRECTORY "${stage}")
foreach(item IN ITEMS CMakeLists.txt CMakePresets.json LICENSE README.md cmake include)
  file(COPY "${SOURCE_DIR}/${item}" DESTINATION "${stage}")
endforeach()
set(archive "${WORK}/gradcomp-${VERSION}.tar.gz")
execute_process(COMMAND "${CMAKE_COMMAND}" -E tar czf "${archive}" "gradcomp-${VERSION}"
                WORKING_DIRECTORY "${WORK}/stage" RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "packing ${archive} failed")
endif()
file(SHA256 "${archive}" sha256)

set(make_program "")
if(MAKE_PROGRAM)
  set(make_program --build-makeprogram "${MAKE_PROGRAM}")
endif()
execute_process(
  COMMAND "${CMAKE_CTEST_COMMAND}"
    --build-and-test "${CMAKE_CURRENT_LIST_DIR}/fetchcontent" "${WORK}/build"
    --build-generator "${GENERATOR}" ${make_program}
    --build-options "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release
      "-DGRADCOMP_ARCHIVE_URL=file://${archive}" "-DGRADCOMP_ARCHIVE_SHA256=${sha256}"
      "-DGRADCOMP_EXPECTED_VERSION=${VERSION}"
    --test-command "${CMAKE_CTEST_COMMAND}" --output-on-failure --no-tests=error
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "the FetchContent consumer failed (${result})")
endif()
