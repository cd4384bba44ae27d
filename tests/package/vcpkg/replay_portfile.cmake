# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DPORT_DIR=<port> -DWORK=<scratch> [-DFEATURES=core;mpi] [-DGENERATOR=Ninja]
#       [-DCXX=<compiler>] [-DARCHIVE_SHA512_FILE=<archive.sha512>]
#       [-DCLI11_DIR=<CLI11's CMake package> -DCLI11_INCLUDE_DIR=<dir with CLI/>]
#       -P replay_portfile.cmake
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
#
# With the feature `tool` (package.vcpkg_port_tool): its dependency cli11 is installed first
# into ${WORK}/installed/x64-linux as vcpkg's cli11 port lays it out (include/CLI/, the CMake
# package in share/cli11/ after vcpkg_cmake_config_fixup), from the CLI11 that CLI11_DIR and
# CLI11_INCLUDE_DIR name (Debian's libcli11-dev); configure finds it there through a toolchain
# file standing in for vcpkg's scripts/buildsystems/vcpkg.cmake; vcpkg_cmake_build builds the
# install target; vcpkg_copy_tools moves the program from bin/ to tools/<port>/ and AUTO_CLEAN
# removes bin/. package.vcpkg_tool then runs the copied program.

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
set(CURRENT_INSTALLED_DIR "${WORK}/installed/${TARGET_TRIPLET}")
set(VCPKG_TARGET_EXECUTABLE_SUFFIX "")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}" "${DOWNLOADS}"
                    "${CURRENT_INSTALLED_DIR}")
set(dependencies "")
foreach(feature IN LISTS FEATURES)
  if(NOT feature STREQUAL "core")
    string(JSON description ERROR_VARIABLE missing GET "${manifest}" features ${feature} description)
    if(missing)
      message(FATAL_ERROR "feature '${feature}' is not in vcpkg.json")
    endif()
    string(JSON n ERROR_VARIABLE none LENGTH "${manifest}" features ${feature} dependencies)
    if(NOT none AND n GREATER 0)
      math(EXPR last "${n} - 1")
      foreach(i RANGE ${last})
        string(JSON dependency GET "${manifest}" features ${feature} dependencies ${i})
        string(JSON name ERROR_VARIABLE plain GET "${dependency}" name)
        if(NOT plain)
          set(dependency "${name}")
        endif()
        list(APPEND dependencies "${dependency}")
      endforeach()
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
    message(FATAL_ERROR "this port should set VCPKG_BUILD_TYPE release (headers and a program)")
  endif()
  set(build "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel")
  set(compiler "")
  if(CXX)
    set(compiler "-DCMAKE_CXX_COMPILER=${CXX}")
  endif()
  # vcpkg configures through its toolchain file, which puts the installed tree of the triplet
  # (the port's dependencies) on the search paths; this one does the part that matters here.
  set(toolchain "${CURRENT_BUILDTREES_DIR}/vcpkg-toolchain.cmake")
  file(WRITE "${toolchain}"
    "# Stands in for vcpkg's scripts/buildsystems/vcpkg.cmake (replay_portfile.cmake)\n"
    "list(PREPEND CMAKE_PREFIX_PATH \"${CURRENT_INSTALLED_DIR}\")\n"
    "list(PREPEND CMAKE_FIND_ROOT_PATH \"${CURRENT_INSTALLED_DIR}\")\n")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${arg_SOURCE_PATH}" -B "${build}" -G "${GENERATOR}"
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}" ${compiler}
      "-DCMAKE_TOOLCHAIN_FILE=${toolchain}"
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

# vcpkg_cmake_build([TARGET <target>] [DISABLE_PARALLEL] ...): the release tree only (this
# port's VCPKG_BUILD_TYPE), on at most VCPKG_MAX_CONCURRENCY jobs (environment; default 2).
function(vcpkg_cmake_build)
  cmake_parse_arguments(PARSE_ARGV 0 arg "DISABLE_PARALLEL;ADD_BIN_TO_PATH"
                        "TARGET;LOGFILE_BASE" "")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "vcpkg_cmake_build was passed extra arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  set(target "")
  if(arg_TARGET)
    set(target --target "${arg_TARGET}")
  endif()
  set(jobs 2)
  if(DEFINED ENV{VCPKG_MAX_CONCURRENCY})
    set(jobs "$ENV{VCPKG_MAX_CONCURRENCY}")
  endif()
  if(arg_DISABLE_PARALLEL)
    set(jobs 1)
  endif()
  execute_process(
    COMMAND "${CMAKE_COMMAND}" --build "${Z_VCPKG_BUILD_DIR}" ${target} --parallel ${jobs}
    RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "vcpkg_cmake_build: building ${arg_TARGET} failed (${result})")
  endif()
endfunction()

# vcpkg_cmake_install([DISABLE_PARALLEL] [ADD_BIN_TO_PATH]): the install target, as vcpkg's.
function(vcpkg_cmake_install)
  cmake_parse_arguments(PARSE_ARGV 0 arg "DISABLE_PARALLEL;ADD_BIN_TO_PATH" "" "")
  set(flags "")
  if(arg_DISABLE_PARALLEL)
    list(APPEND flags DISABLE_PARALLEL)
  endif()
  vcpkg_cmake_build(TARGET install ${flags})
endfunction()

# vcpkg_copy_tools(TOOL_NAMES <name>... [SEARCH_DIR <dir>] [DESTINATION <dir>] [AUTO_CLEAN]):
# copies each <name> from SEARCH_DIR (default bin/) to DESTINATION (default tools/<port>/); a
# missing one is an error. AUTO_CLEAN is vcpkg_clean_executables_in_bin on the same names.
# vcpkg_copy_tool_dependencies, which it calls too, copies DLLs on Windows only: nothing here.
function(vcpkg_copy_tools)
  cmake_parse_arguments(PARSE_ARGV 0 arg "AUTO_CLEAN" "SEARCH_DIR;DESTINATION" "TOOL_NAMES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "vcpkg_copy_tools was passed extra arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT DEFINED arg_TOOL_NAMES)
    message(FATAL_ERROR "TOOL_NAMES must be specified.")
  endif()
  if(NOT DEFINED arg_DESTINATION)
    set(arg_DESTINATION "${CURRENT_PACKAGES_DIR}/tools/${PORT}")
  endif()
  if(NOT DEFINED arg_SEARCH_DIR)
    set(arg_SEARCH_DIR "${CURRENT_PACKAGES_DIR}/bin")
  elseif(NOT IS_DIRECTORY "${arg_SEARCH_DIR}")
    message(FATAL_ERROR "SEARCH_DIR (${arg_SEARCH_DIR}) must be a directory")
  endif()
  foreach(tool_name IN LISTS arg_TOOL_NAMES)
    set(tool_path "${arg_SEARCH_DIR}/${tool_name}${VCPKG_TARGET_EXECUTABLE_SUFFIX}")
    if(NOT EXISTS "${tool_path}")
      message(FATAL_ERROR
        "Couldn't find tool \"${tool_name}\":\n    \"${tool_path}\" does not exist")
    endif()
    file(COPY "${tool_path}" DESTINATION "${arg_DESTINATION}")
  endforeach()
  if(arg_AUTO_CLEAN)
    vcpkg_clean_executables_in_bin(FILE_NAMES ${arg_TOOL_NAMES})
  endif()
endfunction()

# vcpkg_clean_executables_in_bin(FILE_NAMES <name>...): removes them from bin/ and debug/bin/,
# then those directories if they are left empty.
function(vcpkg_clean_executables_in_bin)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_NAMES")
  if(NOT DEFINED arg_FILE_NAMES)
    message(FATAL_ERROR "FILE_NAMES must be specified.")
  endif()
  foreach(file_name IN LISTS arg_FILE_NAMES)
    file(REMOVE "${CURRENT_PACKAGES_DIR}/bin/${file_name}${VCPKG_TARGET_EXECUTABLE_SUFFIX}"
                "${CURRENT_PACKAGES_DIR}/debug/bin/${file_name}${VCPKG_TARGET_EXECUTABLE_SUFFIX}")
  endforeach()
  foreach(dir IN ITEMS "${CURRENT_PACKAGES_DIR}/bin" "${CURRENT_PACKAGES_DIR}/debug/bin")
    if(IS_DIRECTORY "${dir}")
      file(GLOB left "${dir}/*")
      if(NOT left)
        file(REMOVE_RECURSE "${dir}")
      endif()
    endif()
  endforeach()
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
    # The directory above (lib/cmake, share/cmake) goes too when nothing else is left in it.
    get_filename_component(parent "${from}" DIRECTORY)
    file(GLOB left "${parent}/*")
    if(NOT left)
      file(REMOVE_RECURSE "${parent}")
    endif()
  endif()
  file(GLOB configs "${to}/*.cmake")
  foreach(config IN LISTS configs)
    file(READ "${config}" text)
    # Both forms of the prefix computation climb two levels from share/<name>, as in vcpkg:
    # configure_package_config_file's PACKAGE_PREFIX_DIR and install(EXPORT)'s _IMPORT_PREFIX.
    string(REGEX REPLACE
      "get_filename_component\\(PACKAGE_PREFIX_DIR \"\\\${CMAKE_CURRENT_LIST_DIR}/\\.\\./(\\.\\./)*\" ABSOLUTE\\)"
      "get_filename_component(PACKAGE_PREFIX_DIR \"\${CMAKE_CURRENT_LIST_DIR}/../../\" ABSOLUTE)"
      text "${text}")
    set(up "get_filename_component(_IMPORT_PREFIX \"\${_IMPORT_PREFIX}\" PATH)")
    set(climb "\nget_filename_component\\(_IMPORT_PREFIX \"\\\${_IMPORT_PREFIX}\" PATH\\)")
    string(REGEX REPLACE
      "get_filename_component\\(_IMPORT_PREFIX \"\\\${CMAKE_CURRENT_LIST_FILE}\" PATH\\)(${climb})*"
      "get_filename_component(_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_FILE}\" PATH)\n${up}\n${up}"
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

# The features' dependencies, installed into ${CURRENT_INSTALLED_DIR} before the port as vcpkg
# installs them. Only cli11 (feature tool) is: mpi and cuda stand for system components that
# nothing in this port's build reads.
function(z_replay_install_cli11)
  if(NOT CLI11_DIR OR NOT CLI11_INCLUDE_DIR OR NOT EXISTS "${CLI11_INCLUDE_DIR}/CLI/CLI.hpp")
    message(FATAL_ERROR "cli11 is a dependency of the features under test: pass "
                        "-DCLI11_DIR=<CLI11's CMake package> "
                        "-DCLI11_INCLUDE_DIR=<the directory with CLI/>")
  endif()
  # vcpkg's cli11 port: CLI11's own install (include/CLI, share/cmake/CLI11), then
  # vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/CLI11) into share/cli11.
  set(CURRENT_PACKAGES_DIR "${CURRENT_INSTALLED_DIR}")
  set(PORT cli11)
  file(COPY "${CLI11_INCLUDE_DIR}/CLI" DESTINATION "${CURRENT_PACKAGES_DIR}/include")
  file(GLOB configs "${CLI11_DIR}/*.cmake")
  file(COPY ${configs} DESTINATION "${CURRENT_PACKAGES_DIR}/share/cmake/CLI11")
  vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/CLI11)
  message(STATUS "dependency cli11 (from ${CLI11_DIR}) installed into ${CURRENT_INSTALLED_DIR}")
endfunction()
if("cli11" IN_LIST dependencies)
  z_replay_install_cli11()
endif()

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
# The program: in tools/<port>/ with the feature tool (bin/ is gone, above), built against the
# cli11 of the installed tree; nothing in tools/ without it.
set(tool "${CURRENT_PACKAGES_DIR}/tools/${PORT}/gradcomp-bench")
if("tool" IN_LIST FEATURES)
  if(NOT EXISTS "${tool}")
    list(APPEND problems "feature tool: no tools/${PORT}/gradcomp-bench")
  endif()
  file(STRINGS "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel/CMakeCache.txt" cli11_dir
       REGEX "^CLI11_DIR:")
  if(NOT cli11_dir STREQUAL "CLI11_DIR:PATH=${CURRENT_INSTALLED_DIR}/share/cli11")
    list(APPEND problems "CLI11 was not found in the installed tree: ${cli11_dir}")
  endif()
elseif(EXISTS "${CURRENT_PACKAGES_DIR}/tools")
  list(APPEND problems "tools/ in the package without the feature tool")
endif()
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
