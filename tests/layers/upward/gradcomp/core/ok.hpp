// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Layer-check fixture: a core header that reaches up into codec/ (line 12) — the check must
/// reject it. The lines in between hold what must not confuse it: a macro continued with a
/// backslash, brackets and semicolons.

#define GRADCOMP_FIXTURE(x) \
  [x] { return x; }
int fixture[2] = {1, 2}; int other;
#include <gradcomp/codec/fine.hpp>
