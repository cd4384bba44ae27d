// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The one translation unit of a test program that makes the explicit instantiations which
// GRADCOMP_EXTERN_TEMPLATES=1 declares (include/gradcomp/config.hpp): the erasures of every codec
// and controller, compiled once per build tree instead of once per test file
// (tests/CMakeLists.txt, gradcomp_test_instances).
#include <gradcomp/instantiate.hpp>
