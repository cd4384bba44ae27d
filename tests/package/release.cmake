# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# cmake -DSOURCE_DIR=<repo> -DWORK=<scratch> -DVERSION=x.y.z -P release.cmake
#
# package.release: scripts/release VERSION --worktree on this checkout, with everything it
# writes redirected into WORK: the archive and its checksums (WORK/dist), a copy of the vcpkg
# port (WORK/port) and of conandata.yml (WORK/conandata.yml), both pointed at the archive
# through a file:// URL, and the registry copy of the Conan recipe (WORK/dist/conan). Checks
# what it made, and that a VERSION the tree does not say is refused. package.vcpkg_port then
# replays WORK/port, and package.conan builds WORK/dist/conan/all, from that archive.

cmake_policy(VERSION 3.23)
foreach(var IN ITEMS SOURCE_DIR WORK VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "release.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(COPY "${SOURCE_DIR}/ports/gradcomp/" DESTINATION "${WORK}/port")
if(EXISTS "${SOURCE_DIR}/conandata.yml")
  file(COPY_FILE "${SOURCE_DIR}/conandata.yml" "${WORK}/conandata.yml")
endif()
set(name "gradcomp-${VERSION}")
set(archive "${WORK}/dist/${name}.tar.gz")

function(release version out_var)
  execute_process(
    COMMAND bash "${SOURCE_DIR}/scripts/release" ${version} --worktree --dist "${WORK}/dist"
      --url "file://${archive}" --port-dir "${WORK}/port" --conandata "${WORK}/conandata.yml"
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_var} "${result}" PARENT_SCOPE)
  set(release_output "${out}${err}" PARENT_SCOPE)
endfunction()

# A version the tree does not say is refused, before anything is written.
release(9.9.9 result)
if(result EQUAL 0 OR NOT release_output MATCHES "version\\.hpp says ${VERSION}")
  message(FATAL_ERROR "scripts/release 9.9.9 should refuse a ${VERSION} tree:\n${release_output}")
endif()
if(EXISTS "${WORK}/dist/gradcomp-9.9.9.tar.gz")
  message(FATAL_ERROR "the refused release wrote an archive")
endif()

release(${VERSION} result)
message("${release_output}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "scripts/release ${VERSION} --worktree failed (${result})")
endif()

set(problems "")
# The archive: one top directory, the build files, headers, licence, port and recipe.
file(SHA512 "${archive}" sha512)
file(SHA256 "${archive}" sha256)
file(READ "${archive}.sha512" text)
if(NOT text STREQUAL "${sha512}  ${name}.tar.gz\n")
  list(APPEND problems "${name}.tar.gz.sha512 is '${text}', not sha512sum's line for the archive")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -E tar tzf "${archive}" OUTPUT_VARIABLE listing
                RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  list(APPEND problems "${archive} does not list (${result})")
endif()
foreach(file IN ITEMS CMakeLists.txt LICENSE cmake/gradcompConfig.cmake.in
                      include/gradcomp/gradcomp.hpp include/gradcomp/config.hpp conanfile.py
                      test_package/conanfile.py ports/gradcomp/portfile.cmake)
  string(FIND "${listing}" "${name}/${file}\n" at)
  if(at EQUAL -1)
    list(APPEND problems "the archive lacks ${name}/${file}")
  endif()
endforeach()
string(REPLACE "\n" ";" entries "${listing}")
foreach(entry IN LISTS entries)
  if(entry AND (NOT entry MATCHES "^${name}/" OR entry MATCHES "^${name}/build/"))
    list(APPEND problems "the archive holds ${entry}: only tracked files under ${name}/ belong")
    break()
  endif()
endforeach()

# The port and conandata.yml point at it.
file(READ "${WORK}/port/portfile.cmake" portfile)
if(NOT portfile MATCHES "\n  SHA512 ${sha512}\n")
  list(APPEND problems "the port's SHA512 is not the archive's")
endif()
if(NOT portfile MATCHES "\n  URLS \"file://${WORK}/dist/gradcomp-\\\${VERSION}\\.tar\\.gz\"\n")
  list(APPEND problems "the port's URLS is not the archive's")
endif()
file(READ "${WORK}/conandata.yml" conandata)
if(NOT conandata MATCHES "\n  \"${VERSION}\":\n    url: \"file://${archive}\"\n    sha256: \"${sha256}\"\n")
  list(APPEND problems "conandata.yml has no entry for ${VERSION} with the archive's URL and SHA-256:\n${conandata}")
endif()
file(READ "${WORK}/dist/conan/all/conanfile.py" recipe)
if(recipe MATCHES "\n *exports_sources")
  list(APPEND problems "the registry recipe still exports the sources")
endif()
foreach(file IN ITEMS conan/config.yml conan/all/conandata.yml conan/all/test_package/conanfile.py)
  if(NOT EXISTS "${WORK}/dist/${file}")
    list(APPEND problems "no dist/${file}")
  endif()
endforeach()
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "the release is wrong:\n  ${text}")
endif()
message(STATUS "release ${VERSION}: ${archive}, SHA-512 ${sha512}")
