# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DPKG_CONFIG=<pkg-config> -DPC_DIR=<dir holding gradcomp.pc> -DCXX=<compiler>
#       -DCONSUMER=<consumer.cpp> -DWORK=<scratch> -DEXPECTED_VERSION=x.y.z -P pkg_config.cmake
#
# package.pkg_config (against `cmake --install`) and package.vcpkg_pkg_config (against the
# replayed vcpkg port): only PC_DIR is searched; the version must be the one under test; the
# consumer is compiled with nothing but
#   CXX -std=c++20 $(pkg-config --cflags gradcomp) consumer.cpp $(pkg-config --libs gradcomp)
# and run.

cmake_policy(VERSION 3.23)
foreach(var IN ITEMS PKG_CONFIG PC_DIR CXX CONSUMER WORK EXPECTED_VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "pkg_config.cmake: -D${var}=... is required")
  endif()
endforeach()

# Only PC_DIR: a gradcomp.pc elsewhere on the system must not be picked up.
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_LIBDIR} "${PC_DIR}")

function(query out)
  execute_process(COMMAND "${PKG_CONFIG}" ${ARGN} gradcomp
    RESULT_VARIABLE result OUTPUT_VARIABLE text ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "pkg-config ${ARGN} gradcomp failed: ${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

query(version --modversion)
if(NOT version STREQUAL EXPECTED_VERSION)
  message(FATAL_ERROR "pkg-config says gradcomp ${version}, expected ${EXPECTED_VERSION}")
endif()
query(cflags --cflags)
query(libs --libs)
message(STATUS "pkg-config gradcomp ${version}: cflags '${cflags}', libs '${libs}'")
if(cflags MATCHES "-std=")
  message(FATAL_ERROR "Cflags must not choose the language standard: '${cflags}'")
endif()
if(NOT cflags MATCHES "-I([^ ]+)")
  message(FATAL_ERROR "Cflags '${cflags}' name no include directory")
endif()
set(include_dir "${CMAKE_MATCH_1}")
if(NOT EXISTS "${include_dir}/gradcomp/version.hpp")
  message(FATAL_ERROR "Cflags '${cflags}' do not name an include directory holding gradcomp/")
endif()
file(REAL_PATH "${include_dir}" include_dir)
file(REAL_PATH "${PC_DIR}/../.." root)
if(NOT include_dir STREQUAL "${root}/include")
  message(FATAL_ERROR "Cflags point at ${include_dir}, expected ${root}/include")
endif()

string(REPLACE "." ";" parts "${EXPECTED_VERSION}")
list(GET parts 0 major)
list(GET parts 1 minor)
list(GET parts 2 patch)
separate_arguments(cflags_list UNIX_COMMAND "${cflags}")
separate_arguments(libs_list UNIX_COMMAND "${libs}")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(
  COMMAND "${CXX}" -std=c++20 ${cflags_list} -DGRADCOMP_EXPECTED_MAJOR=${major}
    -DGRADCOMP_EXPECTED_MINOR=${minor} -DGRADCOMP_EXPECTED_PATCH=${patch} -Wall -Wextra -Werror
    "${CONSUMER}" -o "${WORK}/consumer" ${libs_list}
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "compiling the consumer with pkg-config's flags failed (${result})")
endif()
execute_process(COMMAND "${WORK}/consumer" RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "the pkg-config consumer failed (${result})")
endif()
