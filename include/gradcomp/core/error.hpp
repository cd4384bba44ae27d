// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The gradcomp exception hierarchy. Every error the library raises derives from
/// `gradcomp::error`, and each message says what was wrong and what was expected.

#include <gradcomp/config.hpp>

#include <stdexcept>
#include <string>

GRADCOMP_NAMESPACE_BEGIN

/// Base of every exception gradcomp throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An invalid parameter or an inconsistent combination of them (e.g. QSGD with `s = 0`, an
/// output buffer smaller than `max_compressed_bytes`, mismatched tensor sizes).
class config_error : public error {
 public:
  using error::error;
};

/// A packet or serialized state that does not follow the wire format: truncated, oversized,
/// wrong magic or version, wrong codec, counts that disagree with the buffer.
class format_error : public error {
 public:
  using error::error;
};

/// A non-finite (NaN or infinite) gradient element given to a codec that cannot represent it
/// (see docs/wire-format.md, "Non-finite inputs"). The message names the first such index.
class numeric_error : public error {
 public:
  using error::error;
};

/// A failure of the communication layer: a peer that disappeared, a timeout, a transport error.
class comm_error : public error {
 public:
  using error::error;
};

GRADCOMP_NAMESPACE_END
