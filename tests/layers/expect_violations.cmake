# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
#
# Runs the layer check (CHECKER) on the fixture tree INCLUDE_DIR with the layer list LAYERS and
# passes only if the check fails and names exactly the fixture's three bad includes: it is the
# test that the check can fail. Test layers.fixture_fails.

execute_process(
  COMMAND "${CMAKE_COMMAND}" "-DLAYERS=${LAYERS}" "-DINCLUDE_DIR=${INCLUDE_DIR}" -P "${CHECKER}"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
set(out "${out}${err}")
if(result EQUAL 0)
  message(FATAL_ERROR "the layer check passed a tree with upward includes:\n${out}")
endif()
foreach(expected IN ITEMS
    "gradcomp/core/ok.hpp:12: core -> codec (a higher layer)"
    "gradcomp/comm/peer.hpp:8: comm -> codec (a peer on the same layer)"
    "gradcomp/comm/peer.hpp:9: \"../core/ok.hpp\"")
  string(FIND "${out}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the layer check did not report `${expected}`:\n${out}")
  endif()
endforeach()
if(NOT out MATCHES "3 include\\(s\\) do not point down")
  message(FATAL_ERROR "the layer check reported other than the fixture's 3 bad includes:\n${out}")
endif()
if(out MATCHES "codec/fine.hpp:|codec/detail/inner.hpp:")
  message(FATAL_ERROR "the layer check rejected a codec header whose includes point down:\n${out}")
endif()
