# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# vcpkg port of gradcomp (header-only). As an overlay port it builds the checkout it lives in:
#
#   vcpkg install gradcomp[mpi] --overlay-ports=<repo>/ports
#
# A copy for a registry replaces the SOURCE_PATH line with the release archive:
#
#   vcpkg_from_github(OUT_SOURCE_PATH SOURCE_PATH REPO <owner>/gradcomp REF "v${VERSION}"
#                     SHA512 <sha512 of the archive> HEAD_REF main)
#
# Features `mpi` and `cuda` only add dependencies: gradcomp::mpi and gradcomp::cuda are defined
# by gradcompConfig.cmake wherever the consumer finds MPI or the CUDA toolkit, so nothing about
# the installed files depends on them.

set(VCPKG_BUILD_TYPE release)  # headers only: no debug tree

get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    mpi  GRADCOMP_PORT_WITH_MPI
    cuda GRADCOMP_PORT_WITH_CUDA)

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
    GRADCOMP_PORT_WITH_CUDA)

vcpkg_cmake_install()
# The package files are installed straight into share/gradcomp, where vcpkg wants them.
vcpkg_cmake_config_fixup(PACKAGE_NAME gradcomp CONFIG_PATH share/gradcomp)
vcpkg_fixup_pkgconfig()

# The licence goes to share/gradcomp/copyright; the copy CMake installs in share/doc goes.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/doc" "${CURRENT_PACKAGES_DIR}/debug")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
