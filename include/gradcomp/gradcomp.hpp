// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Umbrella header of the CPU library: every codec, error-feedback policy and core type.
/// CUDA code lives in gradcomp/cuda/*.cuh and is never included from here.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/approx_topk.hpp>
#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/context.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/natural.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/codec/threshold.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/codec/whole_model.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/thread_pool.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/version.hpp>
