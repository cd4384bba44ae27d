// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Layer-check fixture: codec/ and comm/ are peers, which do not include each other (line 8),
/// and a quoted relative include would escape the check (line 9).

#  include "gradcomp/codec/fine.hpp"
#include "../core/ok.hpp"
