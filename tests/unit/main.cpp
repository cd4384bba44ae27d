// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// The Catch2 runner for gradcomp_tests. Test files only include <catch2/catch.hpp>.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
