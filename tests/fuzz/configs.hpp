// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The configurations the fuzz targets and the corpus generator share (plain strings, so this
/// header costs nothing to include): codec specs, controller specs and pipeline setups. A
/// target picks one by an input byte, and the generator writes seeds for each.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradcomp_fuzz {

/// Codec specs covering every codec and packet variant (small buckets, so packets of a few
/// elements have several).
inline constexpr std::string_view codec_specs[] = {
    "identity",
    "fp16",
    "bf16",
    "int8:bucket=4",
    "int8:bucket=0,rounding=stochastic",
    "onebit",
    "onebit:scaling=none",
    "qsgd:levels=3,bucket=4",
    "qsgd:levels=127,bucket=0",
    "terngrad:bucket=4",
    "natural:bucket=4",
    "dithering:levels=3,partition=natural,norm=l2,bucket=4",
    "dithering:levels=5",
    "topk:k=3",
    "topk:k=3,values=f16",
    "topk:ratio=0.5,values=bf16",
    "threshold:value=0.5",
    "threshold:value=1,values=f16",
    "randomk:k=3",
    "randomk:k=3,scale=true,values=bf16",
    "approx_topk:k=3,tolerance=0",
    "approx_topk:ratio=0.3,values=f16",
    "int4:bucket=4",
    "int4:bucket=0",
    "chunk_topk:chunk=4,k=2",
    "chunk_topk:chunk=2,k=1,values=f16",
    "chunk_topk:chunk=8,k=3,values=int2",
    "chunk_topk:chunk=4,k=4,values=int4",
    "dct_sign:chunk=4,k=2",
    "dct_sign:chunk=2,k=2"};

/// Controller specs covering every kind and option value.
inline constexpr std::string_view controller_specs[] = {
    "dense",
    "static:factor=10",
    "schedule:0=4,3=16,6=1",
    "dgc_warmup:stage_steps=2,final=100,stages=3,base=4",
    "gravac:theta_min=2,theta_max=64,window=2",
    "gravac:theta_min=2,theta_max=64,window=3,policy=geometric,gain=separate,throughput=last,base="
    "current,"
    "dense=keep,smoothing=0.5",
    "accordion:interval=2,accumulation=1",
    "accordion:interval=3,accumulation=2,scope=whole_model",
    "ef_window:window=2",
    "ef_window:min=2,max=64,ratio=4,window=3,max_delay=0.5,settled=1,climb=16,start=64"};

/// A gradient pipeline's options, as strings (`pipeline_options` has the meaning).
struct pipeline_setup {
  std::string_view codec, feedback, controller;
  bool two_way = false;
};

/// Pipeline setups covering the feedback policies, controllers, two-way and PowerSGD.
inline constexpr pipeline_setup pipeline_setups[] = {
    {"topk:ratio=0.25", "residual", "", false},
    {"randomk:ratio=0.25", "ef21", "", false},
    {"topk:ratio=0.25", "dgc:momentum=0.9", "gravac:theta_min=2,theta_max=16,window=2", false},
    {"powersgd:rank=1,min_elements=16", "residual", "", false},
    {"int8:bucket=8", "residual", "", true},
    {"topk:k=4", "residual", "accordion:interval=2,accumulation=1", false},
    {"fp16", "none", "", false},
    {"approx_topk:ratio=0.25", "residual", "schedule:0=2,2=4", false}};

/// The PowerSGD options (a `gradcomp::powersgd_options`) of the state target's option byte
/// `b`: bits 0-1 are rank - 1, bits 2-3 pick min_elements among 0, 1, 16 and 4096.
template <class Options>
Options powersgd_options_of(std::uint8_t b) {
  constexpr std::uint64_t min_elements[4] = {0, 1, 16, 4096};
  Options o;
  o.rank = 1u + (b & 3u);
  o.min_elements = min_elements[(b >> 2) & 3u];
  return o;
}

template <class T, std::size_t N>
constexpr T const& pick(T const (&table)[N], unsigned i) noexcept {
  return table[i % N];
}

}  // namespace gradcomp_fuzz
