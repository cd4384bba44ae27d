// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Layer-check fixture: includes that point down (own folder, lower layers) pass.

#include <gradcomp/codec/detail/inner.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/ok.hpp>
