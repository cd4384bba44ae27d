// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Layer-check fixture: a header of a subfolder belongs to its top-level folder (codec).

#include <gradcomp/core/ok.hpp>
