// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Library version. CMake parses these three macros; keep them on their own lines.

#define GRADCOMP_VERSION_MAJOR 0
#define GRADCOMP_VERSION_MINOR 2
#define GRADCOMP_VERSION_PATCH 0

/// Version as one integer, `major * 10000 + minor * 100 + patch`.
#define GRADCOMP_VERSION \
  (GRADCOMP_VERSION_MAJOR * 10000 + GRADCOMP_VERSION_MINOR * 100 + GRADCOMP_VERSION_PATCH)
