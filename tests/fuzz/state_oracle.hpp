// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The oracle of the saved-state targets: load, save, load into a fresh object, save again.

#include "fuzz.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace gradcomp_fuzz {

/// `make()` builds a fresh object with `load(span)` and `save()`. Loads `state` into one; if that
/// is accepted, its `save()` must load into another fresh object whose `save()` gives the same
/// bytes. If it is rejected, the object must still save what it saved before (nothing).
template <class Make>
void check_reload(Make&& make, std::span<std::byte const> state) {
  auto a = make();
  std::vector<std::byte> const empty = a.save();
  if (!accepted([&] { a.load(state); })) {
    GRADCOMP_FUZZ_CHECK(a.save() == empty, "a rejected state changed the object");
    return;
  }
  std::vector<std::byte> const once = a.save();
  auto b = make();
  GRADCOMP_FUZZ_CHECK(accepted([&] { b.load(std::span<std::byte const>(once)); }),
                      "a re-saved state does not load");
  GRADCOMP_FUZZ_CHECK(b.save() == once, "save(load(save(load(x)))) differs from save(load(x))");
}

}  // namespace gradcomp_fuzz
