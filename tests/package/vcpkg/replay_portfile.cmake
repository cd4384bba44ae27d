# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DPORT_DIR=<port> -DWORK=<scratch> [-DFEATURES=core;mpi] [-DGENERATOR=Ninja]
#       [-DCXX=<compiler>] [-DARCHIVE_SHA512_FILE=<archive.sha512>] -P replay_portfile.cmake
#
# package.vcpkg_port: runs a port's portfile.cmake without vcpkg. PORT_DIR is the copy of
# ports/gradcomp that package.release updated with scripts/release for an archive of this
# checkout (file:// URL, its SHA-512), so the replay builds that archive, not the checkout. The
# vcpkg helpers it calls are defined here with the behaviour of vcpkg's own (scripts/cmake and
# the vcpkg-cmake, vcpkg-cmake-config ports) that matters for this port: the download into
# downloads/ checked against the SHA-512 (a placeholder `SHA512 0` is an error that prints the
# real hash, as in vcpkg), the extraction without the archive's top directory, a Release-only
# CMake configure and install
# into ${CURRENT_PACKAGES_DIR}, vcpkg's warning about unused -D options turned into an error,
# the move of the CMake package to share/<port> and its PACKAGE_PREFIX_DIR rewrite, the .pc
# prefix rewrite, the copyright file. Then a few of vcpkg's post-build checks run on the result.
# package.vcpkg_consumer builds a find_package() consumer against ${WORK}/packages afterwards.

cmake_policy(VERSION 3.23)

foreach(var IN ITEMS PORT_DIR WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "replay_portfile.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED FEATURES)
  set(FEATURES core)
endif()
if(NOT DEFINED GENERATOR)
  set(GENERATOR Ninja)
endif()

file(READ "${PORT_DIR}/vcpkg.json" manifest)
string(JSON PORT GET "${manifest}" name)
string(JSON VERSION GET "${manifest}" version)
set(CURRENT_PACKAGES_DIR "${WORK}/packages")
set(CURRENT_BUILDTREES_DIR "${WORK}/buildtrees")
set(DOWNLOADS "${WORK}/downloads")
set(TARGET_TRIPLET x64-linux)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}" "${DOWNLOADS}")
foreach(feature IN LISTS FEATURES)
  if(NOT feature STREQUAL "core")
    string(JSON description ERROR_VARIABLE missing GET "${manifest}" features ${feature} description)
    if(missing)
      message(FATAL_ERROR "feature '${feature}' is not in vcpkg.json")
    endif()
  endif()
endforeach()

# vcpkg_download_distfile(<var> URLS <url>... FILENAME <name> SHA512 <hash>)
function(vcpkg_download_distfile out)
  cmake_parse_arguments(PARSE_ARGV 1 arg "SKIP_SHA512" "FILENAME;SHA512" "URLS;HEADERS")
  if(arg_SKIP_SHA512 OR NOT arg_SHA512 OR NOT arg_FILENAME OR NOT arg_URLS)
    message(FATAL_ERROR "vcpkg_download_distfile: URLS, FILENAME and SHA512 are required "
                        "(SKIP_SHA512 is not accepted in a port)")
  endif()
  set(file "${DOWNLOADS}/${arg_FILENAME}")
  if(NOT EXISTS "${file}")
    list(GET arg_URLS 0 url)
    file(DOWNLOAD "${url}" "${file}" STATUS status)
    list(GET status 0 code)
    if(NOT code EQUAL 0)
      file(REMOVE "${file}")
      message(FATAL_ERROR "vcpkg_download_distfile: downloading ${url} failed: ${status}")
    endif()
  endif()
  file(SHA512 "${file}" actual)
  if(NOT actual STREQUAL arg_SHA512)
    message(FATAL_ERROR "vcpkg_download_distfile: File does not have expected hash:\n"
                        "  File path: ${file}\n  Expected hash: ${arg_SHA512}\n"
                        "  Actual hash: ${actual}")
  endif()
  set(${out} "${file}" PARENT_SCOPE)
endfunction()

# vcpkg_extract_source_archive(<var> ARCHIVE <archive>): the contents of its one top directory.
function(vcpkg_extract_source_archive out)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "ARCHIVE;SOURCE_BASE;WORKING_DIRECTORY" "PATCHES")
  if(NOT arg_ARCHIVE)
    message(FATAL_ERROR "vcpkg_extract_source_archive: ARCHIVE is required")
  endif()
  set(base "${CURRENT_BUILDTREES_DIR}/src")
  file(REMOVE_RECURSE "${base}/extract")
  file(ARCHIVE_EXTRACT INPUT "${arg_ARCHIVE}" DESTINATION "${base}/extract")
  file(GLOB top LIST_DIRECTORIES true "${base}/extract/*")
  list(LENGTH top n)
  if(NOT n EQUAL 1 OR NOT IS_DIRECTORY "${top}")
    message(FATAL_ERROR "vcpkg_extract_source_archive: ${arg_ARCHIVE} has no single top directory")
  endif()
  get_filename_component(name "${top}" NAME)
  file(REMOVE_RECURSE "${base}/${name}.clean")
  file(RENAME "${top}" "${base}/${name}.clean")
  set(${out} "${base}/${name}.clean" PARENT_SCOPE)
endfunction()

# vcpkg_check_features(OUT_FEATURE_OPTIONS <var> FEATURES <feature> <option>...)
function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_FEATURE_OPTIONS" "FEATURES;INVERTED_FEATURES")
  set(options "")
  list(LENGTH arg_FEATURES n)
  math(EXPR odd "${n} % 2")
  if(odd)
    message(FATAL_ERROR "vcpkg_check_features: FEATURES takes <feature> <option> pairs")
  endif()
  string(JSON declared GET "${manifest}" features)
  while(arg_FEATURES)
    list(POP_FRONT arg_FEATURES feature option)
    string(JSON ignored ERROR_VARIABLE missing GET "${declared}" ${feature})
    if(missing)
      message(FATAL_ERROR "vcpkg_check_features: '${feature}' is not a feature of vcpkg.json")
    endif()
    if(feature IN_LIST FEATURES)
      list(APPEND options "-D${option}=ON")
    else()
      list(APPEND options "-D${option}=OFF")
    endif()
  endwhile()
  set(${arg_OUT_FEATURE_OPTIONS} "${options}" PARENT_SCOPE)
endfunction()

# vcpkg_cmake_configure(SOURCE_PATH <dir> [OPTIONS ...] [MAYBE_UNUSED_VARIABLES ...])
function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH"
                        "OPTIONS;OPTIONS_RELEASE;OPTIONS_DEBUG;MAYBE_UNUSED_VARIABLES")
  if(NOT VCPKG_BUILD_TYPE STREQUAL "release")
    message(FATAL_ERROR "a header-only port should set VCPKG_BUILD_TYPE release")
  endif()
  set(build "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel")
  set(compiler "")
  if(CXX)
    set(compiler "-DCMAKE_CXX_COMPILER=${CXX}")
  endif()
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${arg_SOURCE_PATH}" -B "${build}" -G "${GENERATOR}"
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}" ${compiler}
      -DVCPKG_TARGET_TRIPLET=${TARGET_TRIPLET} ${arg_OPTIONS} ${arg_OPTIONS_RELEASE}
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "vcpkg_cmake_configure: configure failed (${result})")
  endif()
  # vcpkg warns about -D options the project never read; here that is an error, except for the
  # variables the portfile lists as maybe unused (and the triplet, which vcpkg always passes).
  if(err MATCHES "Manually-specified variables were not used by the project:\n\n([^\n]+(\n [^\n]+)*)")
    string(REGEX MATCHALL "[A-Za-z0-9_]+" unused "${CMAKE_MATCH_1}")
    list(REMOVE_ITEM unused VCPKG_TARGET_TRIPLET ${arg_MAYBE_UNUSED_VARIABLES})
    if(unused)
      message(FATAL_ERROR "vcpkg_cmake_configure: unused variables not in "
                          "MAYBE_UNUSED_VARIABLES: ${unused}")
    endif()
  endif()
  set(Z_VCPKG_BUILD_DIR "${build}" PARENT_SCOPE)
endfunction()

function(vcpkg_cmake_install)
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${Z_VCPKG_BUILD_DIR}" --target install
                  RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "vcpkg_cmake_install: install failed (${result})")
  endif()
endfunction()

# vcpkg_cmake_config_fixup([PACKAGE_NAME <name>] [CONFIG_PATH <dir>]): the package must end up in
# share/<name>, with the prefix computed from there.
function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "PACKAGE_NAME;CONFIG_PATH" "")
  if(NOT arg_PACKAGE_NAME)
    set(arg_PACKAGE_NAME "${PORT}")
  endif()
  if(NOT arg_CONFIG_PATH)
    set(arg_CONFIG_PATH "share/${arg_PACKAGE_NAME}")
  endif()
  set(from "${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH}")
  set(to "${CURRENT_PACKAGES_DIR}/share/${arg_PACKAGE_NAME}")
  if(NOT IS_DIRECTORY "${from}")
    message(FATAL_ERROR "vcpkg_cmake_config_fixup: '${from}' does not exist.")
  endif()
  if(NOT from STREQUAL to)
    file(MAKE_DIRECTORY "${to}")
    file(GLOB files "${from}/*")
    file(COPY ${files} DESTINATION "${to}")
    file(REMOVE_RECURSE "${from}")
  endif()
  file(GLOB configs "${to}/*.cmake")
  foreach(config IN LISTS configs)
    file(READ "${config}" text)
    string(REGEX REPLACE
      "get_filename_component\\(PACKAGE_PREFIX_DIR \"\\\${CMAKE_CURRENT_LIST_DIR}/\\.\\./(\\.\\./)*\" ABSOLUTE\\)"
      "get_filename_component(PACKAGE_PREFIX_DIR \"\${CMAKE_CURRENT_LIST_DIR}/../../\" ABSOLUTE)"
      text "${text}")
    file(WRITE "${config}" "${text}")
  endforeach()
endfunction()

# vcpkg_fixup_pkgconfig(): prefix=${pcfiledir}/<back to the installed root>.
function(vcpkg_fixup_pkgconfig)
  file(GLOB pcs "${CURRENT_PACKAGES_DIR}/lib/pkgconfig/*.pc" "${CURRENT_PACKAGES_DIR}/share/pkgconfig/*.pc")
  foreach(pc IN LISTS pcs)
    file(READ "${pc}" text)
    string(REGEX REPLACE "(^|\n)prefix=[^\n]*" "\\1prefix=\${pcfiledir}/../.." text "${text}")
    file(WRITE "${pc}" "${text}")
  endforeach()
  set(Z_GRADCOMP_PC_FILES "${pcs}" PARENT_SCOPE)
endfunction()

function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_LIST")
  set(text "")
  foreach(file IN LISTS arg_FILE_LIST)
    file(READ "${file}" content)
    string(APPEND text "${content}")
  endforeach()
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright" "${text}")
endfunction()

include("${PORT_DIR}/portfile.cmake")

# A subset of vcpkg's post-build checks, and what this port promises.
set(problems "")
set(share "${CURRENT_PACKAGES_DIR}/share/${PORT}")
foreach(file IN ITEMS copyright usage gradcompConfig.cmake gradcompConfigVersion.cmake
                      gradcompTargets.cmake gradcompCudaStandard.cmake)
  if(NOT EXISTS "${share}/${file}")
    list(APPEND problems "missing share/${PORT}/${file}")
  endif()
endforeach()
if(NOT EXISTS "${CURRENT_PACKAGES_DIR}/include/gradcomp/gradcomp.hpp")
  list(APPEND problems "missing include/gradcomp/gradcomp.hpp")
endif()
# With -DARCHIVE_SHA512_FILE=<the archive's .sha512>: what the port built is that archive.
if(DEFINED ARCHIVE_SHA512_FILE)
  file(READ "${ARCHIVE_SHA512_FILE}" expected)
  string(REGEX MATCH "^[0-9a-f]+" expected "${expected}")
  file(GLOB archives "${DOWNLOADS}/*")
  if(NOT archives)
    list(APPEND problems "the port downloaded nothing: it must build the release archive")
  endif()
  foreach(archive IN LISTS archives)
    file(SHA512 "${archive}" sha512)
    if(NOT sha512 STREQUAL expected)
      list(APPEND problems "${archive} is not the release archive under test")
    endif()
  endforeach()
endif()
if(NOT Z_GRADCOMP_PC_FILES)
  list(APPEND problems "no .pc file was installed (vcpkg_fixup_pkgconfig found none)")
endif()
foreach(dir IN ITEMS debug lib bin share/doc share/cmake)
  if(EXISTS "${CURRENT_PACKAGES_DIR}/${dir}")
    list(APPEND problems "unexpected ${dir}/ in the package")
  endif()
endforeach()
# No absolute path of the build machine may leak into the installed files.
file(GLOB_RECURSE installed "${CURRENT_PACKAGES_DIR}/share/*")
foreach(file IN LISTS installed)
  file(STRINGS "${file}" hits REGEX "${WORK}|${PORT_DIR}")
  if(hits)
    list(APPEND problems "${file} names a path of this machine: ${hits}")
  endif()
endforeach()
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "the replayed port is wrong:\n  ${text}")
endif()
message(STATUS "port ${PORT} ${VERSION} [${FEATURES}] replayed into ${CURRENT_PACKAGES_DIR}")
