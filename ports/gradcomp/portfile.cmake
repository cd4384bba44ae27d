# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# vcpkg port of gradcomp (header-only; the feature `tool` adds a program). It builds the release
# archive that scripts/release makes with `git archive` and publishes (URLS, SHA512:
# scripts/release VERSION rewrites both), never the checkout it sits in, so vcpkg's binary cache
# key covers every source file:
#
#   vcpkg install gradcomp[mpi] --overlay-ports=<repo>/ports
#
# Features `mpi` and `cuda` only add dependencies: gradcomp::mpi and gradcomp::cuda are defined
# by gradcompConfig.cmake wherever the consumer finds MPI or the CUDA toolkit, so nothing about
# the installed files depends on them. Feature `tool` builds the program gradcomp-bench against
# the cli11 port and installs it to tools/gradcomp/, where vcpkg keeps a port's executables:
#
#   vcpkg install "gradcomp[tool]" --overlay-ports=<repo>/ports

set(VCPKG_BUILD_TYPE release)  # headers, and a program that needs no debug build: no debug tree

vcpkg_download_distfile(ARCHIVE
  URLS "https://github.com/gradcomp/gradcomp/releases/download/v${VERSION}/gradcomp-${VERSION}.tar.gz"
  FILENAME "gradcomp-${VERSION}.tar.gz"
  SHA512 b74b3d4b7d24d415c0ab4cc0dc4e28c8a76576a64b615503d14a1130f3f7a96de60fb2b74081a4abb0f3dbf29e3ad52e6f3e7638346072fce419ac0774614f76
)
vcpkg_extract_source_archive(SOURCE_PATH ARCHIVE "${ARCHIVE}")

# With `tool`, a CLI11 that is not found is an error (tools/CMakeLists.txt only warns).
vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    mpi  GRADCOMP_PORT_WITH_MPI
    cuda GRADCOMP_PORT_WITH_CUDA
    tool GRADCOMP_BUILD_TOOLS
    tool CMAKE_REQUIRE_FIND_PACKAGE_CLI11)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DGRADCOMP_BUILD_TESTS=OFF
    -DGRADCOMP_BUILD_BENCH=OFF
    -DGRADCOMP_BUILD_EXAMPLES=OFF
    -DGRADCOMP_BUILD_PYTHON=OFF
    -DGRADCOMP_WITH_BLAS=OFF
    -DGRADCOMP_ENABLE_CUDA=OFF
    -DGRADCOMP_INSTALL=ON
    -DGRADCOMP_INSTALL_CMAKEDIR=share/gradcomp
  MAYBE_UNUSED_VARIABLES
    GRADCOMP_PORT_WITH_MPI
    GRADCOMP_PORT_WITH_CUDA
    CMAKE_REQUIRE_FIND_PACKAGE_CLI11)

vcpkg_cmake_install()
if("tool" IN_LIST FEATURES)
  # bin/gradcomp-bench -> tools/gradcomp/gradcomp-bench; AUTO_CLEAN removes bin/.
  vcpkg_copy_tools(TOOL_NAMES gradcomp-bench AUTO_CLEAN)
endif()
# The package files are installed straight into share/gradcomp, where vcpkg wants them.
vcpkg_cmake_config_fixup(PACKAGE_NAME gradcomp CONFIG_PATH share/gradcomp)
vcpkg_fixup_pkgconfig()

# The licence goes to share/gradcomp/copyright; the copy CMake installs in share/doc goes.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/doc" "${CURRENT_PACKAGES_DIR}/debug")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
