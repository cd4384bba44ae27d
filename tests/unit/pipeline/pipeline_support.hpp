// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// A plain reference for `gradient_pipeline`: every rank's contribution computed on one thread
// from the same gradients (each simulated rank with its own one-phase `compressor`), packets
// decoded and summed in rank order, the sum averaged — what the pipeline must produce bit for
// bit, given the decision it reports. Shared by the in-process and the MPI pipeline tests.

#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace pipeline_test {

namespace gc = gradcomp;

/// Sizes of the test model's tensors: two compressed, one small (dense) in between.
inline std::vector<std::size_t> model_sizes() { return {6000, 700, 20000}; }

/// Heavy-tailed, time-correlated gradient of (rank, step, tensor): deterministic.
inline float grad_value(int rank, std::uint64_t step, std::size_t tensor, std::size_t i) {
  double const x = std::sin(0.013 * static_cast<double>(i) + 0.7 * static_cast<double>(tensor) + 0.11 * rank +
                            0.05 * static_cast<double>(step));
  double const spike = (i * 2654435761u + tensor * 97u + static_cast<std::size_t>(rank) * 13u) % 61u == 0 ? 8.0 : 1.0;
  return static_cast<float>(spike * x * x * x + 0.01 * std::cos(0.3 * static_cast<double>(i)));
}

template <class T>
std::vector<std::vector<T>> make_grads(int rank, std::uint64_t step, std::vector<std::size_t> const& sizes) {
  std::vector<std::vector<T>> g(sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    g[t].resize(sizes[t]);
    for (std::size_t i = 0; i < sizes[t]; ++i) g[t][i] = gc::from_float<T>(grad_value(rank, step, t, i));
  }
  return g;
}

template <class T>
std::vector<gc::tensor_view<T>> views(std::vector<std::vector<T>>& g) {
  std::vector<gc::tensor_view<T>> v;
  for (std::size_t t = 0; t < g.size(); ++t) v.emplace_back(std::span<T>(g[t]), static_cast<gc::tensor_id>(t));
  return v;
}

/// The reference of one configuration over W simulated ranks.
class reference {
 public:
  reference(gc::pipeline_options const& opt, int world) : opt_(opt), world_(world) {
    base_ = gc::make_codec(opt.codec);
    for (int r = 0; r < world; ++r) comps_.push_back(gc::make_feedback(opt.feedback, base_));
  }

  /// The averaged outputs of step `step` given the pipeline's reported decision.
  template <class T>
  std::vector<std::vector<T>> step(std::uint64_t step, gc::pipeline_stats const& st, std::vector<std::size_t> const& sizes) {
    float const alpha = 1.0f / static_cast<float>(world_);
    bool const dense = st.sent == gc::send_kind::dense;
    bool keep = false;
    if (dense && !opt_.controller.empty()) {
      keep = opt_.controller.find("dense=keep") != std::string::npos &&
             std::visit([](auto const& c) { return !std::remove_cvref_t<decltype(c)>::receives; }, comps_[0]);
    }
    gc::any_codec const codec =
        opt_.controller.empty() || dense ? base_ : base_.with_budget(gc::sparse_budget::factor(st.factor));
    std::vector<std::vector<std::vector<T>>> grads;
    for (int r = 0; r < world_; ++r) grads.push_back(make_grads<T>(r, step, sizes));
    std::vector<std::vector<T>> out(sizes.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::size_t const n = sizes[t];
      std::vector<float> acc(n, 0.0f);
      auto const id = static_cast<gc::tensor_id>(t);
      bool const large = n >= opt_.buckets.min_compress_elements;
      if (!large || dense) {
        // dense f32 all-reduce: sum in rank order, then scale
        for (int r = 0; r < world_; ++r) {
          std::vector<T> const& g = grads[static_cast<std::size_t>(r)][t];
          std::vector<float> in(n);
          for (std::size_t i = 0; i < n; ++i) in[i] = gc::to_float(g[i]);
          if (large) {
            std::visit(
                [&](auto& c) {
                  auto const staged = c.stage_input(gc::tensor_view<T const>(std::span<T const>(g), id), ctx(r, step));
                  if (!keep) in.assign(staged.begin(), staged.end());
                  if (keep) c.discard(id);
                  else c.commit_lossless(id);
                },
                comps_[static_cast<std::size_t>(r)]);
          }
          for (std::size_t i = 0; i < n; ++i) acc[i] += in[i];
        }
        for (float& v : acc) v *= alpha;
      } else {
        std::vector<std::vector<std::byte>> packets;
        for (int r = 0; r < world_; ++r) {
          std::vector<T> const& g = grads[static_cast<std::size_t>(r)][t];
          std::vector<std::byte> p(codec.max_compressed_bytes(n));
          std::visit(
              [&](auto& c) {
                c.codec() = codec;
                p.resize(c.compress(gc::tensor_view<T const>(std::span<T const>(g), id), std::span<std::byte>(p), ctx(r, step)));
              },
              comps_[static_cast<std::size_t>(r)]);
          packets.push_back(std::move(p));
        }
        gc::codec_context const dctx = ctx(0, step);
        if (codec.aggregation() == gc::aggregation_kind::gather) {
          bool first = alpha == 1.0f;
          for (auto const& p : packets) {
            if (first) codec.decompress(std::span<std::byte const>(p), std::span<float>(acc), dctx);
            else codec.decompress_add(std::span<std::byte const>(p), std::span<float>(acc), alpha, dctx);
            first = false;
          }
        } else {  // summable / shared support: values summed in rank order, decoded once
          std::vector<std::byte> sum = packets[0];
          gc::value_section const sec = gc::detail::section_of(codec, std::span<std::byte const>(sum));
          for (int r = 1; r < world_; ++r) {
            gc::reduce_into(gc::detail::comm_type_of_dtype(sec.type), gc::reduce_op::sum, sum.data() + sec.offset,
                                    packets[static_cast<std::size_t>(r)].data() + sec.offset, sec.bytes);
          }
          if (alpha != 1.0f) codec.decompress_add(std::span<std::byte const>(sum), std::span<float>(acc), alpha, dctx);
          else codec.decompress(std::span<std::byte const>(sum), std::span<float>(acc), dctx);
        }
      }
      if (large) {
        // EF21: the receiver's estimate (one per tensor, identical on every rank)
        std::visit([&](auto& c) { c.receive(id, std::span<float>(acc)); }, comps_[0]);
      }
      out[t].resize(n);
      for (std::size_t i = 0; i < n; ++i) out[t][i] = gc::from_float<T>(acc[i]);
    }
    return out;
  }

  [[nodiscard]] std::span<float const> state(int rank, gc::tensor_id id) {
    return std::visit([&](auto& c) { return c.state(id).values(); }, comps_[static_cast<std::size_t>(rank)]);
  }

 private:
  [[nodiscard]] gc::codec_context ctx(int rank, std::uint64_t step) const {
    gc::codec_context c = opt_.context;
    c.step = static_cast<std::uint32_t>(step);
    bool const shared = base_.aggregation() == gc::aggregation_kind::shared_support;
    c.seed = opt_.seed + (shared ? 0u : static_cast<std::uint64_t>(rank));
    return c;
  }

  gc::pipeline_options opt_;
  int world_;
  gc::any_codec base_ = gc::make_codec("identity");
  std::vector<gc::feedback_compressor> comps_;
};

/// Bitwise equality of two tensors (as their bit patterns; NaN never appears here).
template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace pipeline_test
