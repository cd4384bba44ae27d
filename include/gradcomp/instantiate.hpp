// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The explicit instantiations that `GRADCOMP_EXTERN_TEMPLATES` (config.hpp) declares: the
/// `any_codec` erasure of every codec `make_codec` builds and the `any_controller` erasure of every
/// controller `make_controller` builds. A program built with `GRADCOMP_EXTERN_TEMPLATES=1`
/// includes this header in exactly one of its translation units (none leaves the erasures undefined
/// at link time; two are two explicit instantiation definitions of the same class, which C++ forbids
/// and a linker need not report), compiled with the same flags as the rest, for example:
///
///     // gradcomp_instances.cpp
///     #include <gradcomp/instantiate.hpp>
///
/// Without `GRADCOMP_EXTERN_TEMPLATES` the header still compiles and makes the same
/// instantiations, which every other translation unit then also makes for itself.

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/config.hpp>

GRADCOMP_NAMESPACE_BEGIN

#define GRADCOMP_DETAIL_INSTANTIATE_CODEC_MODEL(C) template struct any_codec::model<C>;
GRADCOMP_DETAIL_MAKE_CODEC_TYPES(GRADCOMP_DETAIL_INSTANTIATE_CODEC_MODEL)
#undef GRADCOMP_DETAIL_INSTANTIATE_CODEC_MODEL

#define GRADCOMP_DETAIL_INSTANTIATE_CONTROLLER_MODEL(C) template struct any_controller::model<C>;
GRADCOMP_DETAIL_MAKE_CONTROLLER_TYPES(GRADCOMP_DETAIL_INSTANTIATE_CONTROLLER_MODEL)
#undef GRADCOMP_DETAIL_INSTANTIATE_CONTROLLER_MODEL

GRADCOMP_NAMESPACE_END
