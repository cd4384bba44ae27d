// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Umbrella header of the CPU library: the training pipeline (`gradient_pipeline`, the front
/// door), every codec, error-feedback policy, controller, collective and core type, the
/// optimizers, topologies and the runtime model.
/// CUDA code lives in gradcomp/cuda/*.cuh and is never included from here.

#include <gradcomp/adapt/accordion.hpp>
#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/adapt/gravac.hpp>
#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/adapt/schedule.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/approx_topk.hpp>
#include <gradcomp/codec/budget.hpp>
#include <gradcomp/codec/cast.hpp>
#include <gradcomp/codec/codec_spec.hpp>
#include <gradcomp/codec/dithering.hpp>
#include <gradcomp/codec/int8.hpp>
#include <gradcomp/codec/natural.hpp>
#include <gradcomp/codec/onebit.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/codec/randomk.hpp>
#include <gradcomp/codec/recompress.hpp>
#include <gradcomp/codec/threshold.hpp>
#include <gradcomp/codec/topk.hpp>
#include <gradcomp/codec/whole_model.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/hierarchical.hpp>
#include <gradcomp/collective/low_rank.hpp>
#include <gradcomp/collective/parameter_server.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/collective/sections.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/comm/async_adaptor.hpp>
#include <gradcomp/comm/group.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/concepts/controller.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/concepts/mixer.hpp>
#include <gradcomp/concepts/optimizer.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/dtype.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/cpu/thread_pool.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/dgc.hpp>
#include <gradcomp/feedback/make_feedback.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/model/runtime.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/choco.hpp>
#include <gradcomp/optim/comm_mixer.hpp>
#include <gradcomp/optim/compressed_adam.hpp>
#include <gradcomp/optim/decentralized.hpp>
#include <gradcomp/optim/mixing.hpp>
#include <gradcomp/optim/sgd.hpp>
#include <gradcomp/pipeline/options.hpp>
#include <gradcomp/pipeline/pipeline.hpp>
#include <gradcomp/topology/topology.hpp>
#include <gradcomp/version.hpp>
