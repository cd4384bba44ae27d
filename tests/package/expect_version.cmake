# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# Included by the consumer projects: hands GRADCOMP_EXPECTED_VERSION (x.y.z) to consumer.cpp,
# which checks at compile time that the version.hpp it sees is that version, so a stray
# gradcomp elsewhere on the include path cannot pass for the one under test.

if(DEFINED GRADCOMP_EXPECTED_VERSION)
  if(NOT GRADCOMP_EXPECTED_VERSION MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$")
    message(FATAL_ERROR "GRADCOMP_EXPECTED_VERSION='${GRADCOMP_EXPECTED_VERSION}' is not x.y.z")
  endif()
  target_compile_definitions(consumer PRIVATE
    GRADCOMP_EXPECTED_MAJOR=${CMAKE_MATCH_1}
    GRADCOMP_EXPECTED_MINOR=${CMAKE_MATCH_2}
    GRADCOMP_EXPECTED_PATCH=${CMAKE_MATCH_3})
endif()
