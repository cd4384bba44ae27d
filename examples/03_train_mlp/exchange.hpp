// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `gradient_exchange`: the one place where the training example's gradients leave a worker.
/// Each step it takes the worker's per-layer gradient tensors and replaces them, on every rank,
/// with the average over all ranks of what the pipeline sent:
///
///   dense      float32 all-reduce of the raw gradients (the baseline);
///   codec      a fixed codec (fp16, onebit, identity, int8, ...), with or without error
///              feedback: compress -> all-gather the packets -> decode every rank's packet in
///              rank order and sum -> divide by the number of ranks;
///   topk       a sparsifier whose compression factor (top-k ratio = 1/factor) a controller
///              picks per step (control.hpp): static, a schedule, or an adaptive one. The step
///              compresses g_ef = g + residual at every factor the controller's plan names
///              (multi-level: each from the packet before), reports the statistics the
///              controller needs (‖g_ef‖², ‖C(g_ef)‖² per factor, per-layer norms, the last
///              step's compute / compress / sync times), agrees them across ranks, and sends
///              what the decision says (candidate, minimum or dense), updating the residual as
///              the decision says.
///
/// Error feedback is gradcomp's `compressor<any_codec, residual_feedback>`, one residual per
/// tensor id; decisions other than "send the first packet" adjust that residual afterwards.
/// The transport is the gather of packets available on every communicator; the library's
/// compressed collectives, which pick all-reduce for summable codecs, can replace
/// `send_packets` without changing anything else.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/comm/any_communicator.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/context.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/tensor.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>

#include "control.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace train {

/// How gradients are exchanged.
struct exchange_options {
  /// "dense" (float32 all-reduce), a fixed codec spec for `gradcomp::make_codec` ("fp16",
  /// "onebit", "identity", ...), or "topk" / "topk:values=f16" (the factor comes from
  /// `controller`).
  std::string codec = "dense";
  /// Residual error feedback (ignored for "dense").
  bool error_feedback = true;
  /// Controller spec for "topk" (control.hpp), e.g. "static:factor=100".
  std::string controller = "static:factor=100";
  /// Seed of the codecs' random streams (stochastic codecs); ranks add their rank to it, except
  /// for codecs whose ranks must draw the same numbers.
  std::uint64_t seed = 7;
};

/// What the caller knows about the step being exchanged.
struct step_info {
  std::uint64_t step = 0;
  double backprop_s = 0.0;  ///< this step's forward + backward time
  std::uint64_t batch = 0;  ///< samples per worker
  double learning_rate = 0.0;
  double next_learning_rate = 0.0;
};

/// What one exchange did (this rank).
struct exchange_report {
  std::size_t bytes_sent = 0;  ///< bytes this rank contributed to the collective(s)
  /// Bytes this rank puts on the wire under the bandwidth-optimal algorithms (ring all-reduce:
  /// 2(n-1)/n of the buffer; ring all-gather: every block but the next rank's), as gradcomp's
  /// `collective_result::wire_bytes` models them. Statistics rounds of the controllers excluded.
  std::size_t wire_bytes = 0;
  double factor = 1.0;         ///< compression factor of what was sent (1 = dense)
  char const* sent = "dense";  ///< "dense", "minimum" or "candidate"
  double compress_s = 0.0;     ///< compression, decoding, norms and residual updates
  double sync_s = 0.0;         ///< collectives (statistics and gradients)
  double gain = 1.0;           ///< ‖C(g_ef)‖² / ‖g_ef‖² of what was sent, over all ranks
};

/// The per-step gradient pipeline (see file comment).
class gradient_exchange {
 public:
  gradient_exchange(gradcomp::any_communicator comm, exchange_options opts)
      : comm_(std::move(comm)), opts_(std::move(opts)) {
    ctx_.parallel_threshold = std::numeric_limits<std::size_t>::max();  // ranks are threads already
    std::string_view const family = std::string_view(opts_.codec).substr(0, opts_.codec.find(':'));
    if (opts_.codec == "dense") {
      mode_ = mode::dense;
    } else if (family == "topk") {
      mode_ = mode::sparsify;
      ctrl_.emplace(make_controller(opts_.controller));
    } else {
      mode_ = mode::fixed;
      fixed_ = gradcomp::make_codec(opts_.codec);
    }
    bool const shared =
        mode_ == mode::fixed && fixed_->aggregation() == gradcomp::aggregation_kind::shared_support;
    ctx_.seed = opts_.seed + (shared ? 0u : static_cast<std::uint64_t>(comm_.rank()));
  }

  [[nodiscard]] gradcomp::any_communicator& communicator() noexcept { return comm_; }
  [[nodiscard]] exchange_options const& options() const noexcept { return opts_; }

  /// The error-feedback residual of tensor `t` (empty: zero, or no error feedback).
  [[nodiscard]] std::span<float const> residual(std::size_t t) {
    if (!opts_.error_feedback || mode_ == mode::dense) return {};
    return ef_.state(static_cast<gradcomp::tensor_id>(t)).values();
  }

  /// One line describing the pipeline.
  [[nodiscard]] std::string describe() const {
    switch (mode_) {
      case mode::dense: return "dense float32 all-reduce";
      case mode::fixed:
        return std::string(fixed_->name()) + (opts_.error_feedback ? " + error feedback" : "") +
               ", all-gather of packets";
      case mode::sparsify:
        return opts_.codec + " at the factor of controller " + opts_.controller +
               (opts_.error_feedback ? " + error feedback" : "") + ", all-gather of packets";
    }
    return {};
  }

  /// Replaces each tensor of `grads` (tensor i has id i; same shapes on every rank) with the
  /// average over ranks of what the pipeline sent. Collective: every rank calls it each step.
  exchange_report exchange(std::span<std::span<float> const> grads, step_info const& info) {
    prepare(grads);
    exchange_report rep;
    switch (mode_) {
      case mode::dense: dense_sum(grads, rep); break;
      case mode::fixed: fixed_step(grads, info, rep); break;
      case mode::sparsify: adaptive_step(grads, info, rep); break;
    }
    last_ = {info.backprop_s, rep.compress_s, rep.sync_s};
    return rep;
  }

 private:
  enum class mode { dense, fixed, sparsify };
  using clock = std::chrono::steady_clock;
  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }
  static double norm_sq(std::span<float const> v) {
    double s = 0.0;
    for (float x : v) s += static_cast<double>(x) * x;
    return s;
  }

  void prepare(std::span<std::span<float> const> grads) {
    if (scratch_.empty()) {
      for (auto const& g : grads) scratch_.emplace_back(g.size());
      base_.resize(grads.size());
      acc_.resize(grads.size());
    }
    if (grads.size() != scratch_.size()) {
      throw gradcomp::config_error("train: gradient_exchange got " + std::to_string(grads.size()) +
                                   " tensors, expected " + std::to_string(scratch_.size()) +
                                   " as before");
    }
    for (std::size_t t = 0; t < grads.size(); ++t) {
      if (grads[t].size() != scratch_[t].size()) {
        throw gradcomp::config_error("train: gradient tensor " + std::to_string(t) +
                                     " changed size");
      }
    }
  }

  // Sums every tensor over the ranks with one float32 all-reduce and divides by the rank count.
  void dense_sum(std::span<std::span<float> const> grads, exchange_report& rep) {
    std::size_t total = 0;
    for (auto const& g : grads) total += g.size();
    flat_.resize(total);
    auto t0 = clock::now();
    std::size_t at = 0;
    for (auto const& g : grads)
      at = static_cast<std::size_t>(
          std::copy(g.begin(), g.end(), flat_.begin() + static_cast<std::ptrdiff_t>(at)) -
          flat_.begin());
    comm_.all_reduce(std::as_writable_bytes(std::span<float>(flat_)), gradcomp::comm_type::f32,
                     gradcomp::reduce_op::sum);
    float const inv = 1.0f / static_cast<float>(comm_.size());
    at = 0;
    for (auto const& g : grads) {
      for (float& v : g) v = flat_[at++] * inv;
    }
    rep.sync_s += seconds_since(t0);
    rep.bytes_sent += total * sizeof(float);
    auto const w = static_cast<std::size_t>(comm_.size());
    rep.wire_bytes += w <= 1 ? 0 : 2 * (total * sizeof(float)) * (w - 1) / w;
  }

  // Compresses tensor t (the gradient g) at codec c with error feedback (or without); writes
  // the packet into packets_[level][t] and returns ‖g_ef‖² (computed before the residual moves).
  double compress_first(std::size_t t, std::span<float> g, gradcomp::any_codec const& c,
                        std::uint32_t step) {
    auto const id = static_cast<gradcomp::tensor_id>(t);
    auto view = gradcomp::tensor_view<float const>(std::span<float const>(g), id);
    auto& out = packets_[0][t];
    out.resize(c.max_compressed_bytes(g.size()));
    gradcomp::codec_context ctx = ctx_;
    ctx.step = step;
    double ef = 0.0;
    std::size_t bytes = 0;
    if (opts_.error_feedback) {
      auto const r = ef_.state(id).values();  // empty until the first step: zero
      if (r.empty())
        ef = norm_sq(g);
      else {
        for (std::size_t i = 0; i < g.size(); ++i) {
          double const v = static_cast<double>(g[i]) + r[i];
          ef += v * v;
        }
      }
      ef_.codec() = c;
      bytes = ef_.compress(view, std::span<std::byte>(out), ctx);
    } else {
      ef = norm_sq(g);
      bytes = c.compress(view, std::span<std::byte>(out), ctx);
    }
    out.resize(bytes);
    return ef;
  }

  void ensure_levels(std::size_t levels, std::size_t tensors) {
    if (packets_.size() < levels) packets_.resize(levels);
    for (auto& p : packets_) p.resize(tensors);
  }

  void fixed_step(std::span<std::span<float> const> grads, step_info const& info,
                  exchange_report& rep) {
    ensure_levels(1, grads.size());
    auto t0 = clock::now();
    double ef = 0.0, sent = 0.0;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      ef += compress_first(t, grads[t], *fixed_, static_cast<std::uint32_t>(info.step));
      fixed_->decompress(std::span<std::byte const>(packets_[0][t]), std::span<float>(scratch_[t]),
                         ctx_);
      sent += norm_sq(scratch_[t]);
    }
    rep.compress_s += seconds_since(t0);
    rep.factor = 32.0 / fixed_->bits_per_element();
    rep.sent = "minimum";
    rep.gain = ef > 0.0 ? sent / ef : 1.0;
    send_packets(grads, 0, *fixed_, rep);
  }

  // The codec of the sparsifier family at `factor` (cached).
  gradcomp::any_codec const& codec_at(double factor) {
    auto it = codecs_.find(factor);
    if (it != codecs_.end()) return it->second;
    char buf[64];
    auto const res = std::to_chars(buf, buf + sizeof buf, 1.0 / factor);
    std::string spec = opts_.codec + (opts_.codec.find(':') == std::string::npos ? ":" : ",") +
                       "ratio=" + std::string(buf, res.ptr);
    return codecs_.emplace(factor, gradcomp::make_codec(spec)).first->second;
  }

  void adaptive_step(std::span<std::span<float> const> grads, step_info const& info,
                     exchange_report& rep) {
    step_plan const plan = ctrl_->plan();
    std::size_t const levels = plan.measure.size();
    ensure_levels(std::max<std::size_t>(levels, 1), grads.size());
    auto const step32 = static_cast<std::uint32_t>(info.step);
    auto t0 = clock::now();

    step_stats s;
    s.step = plan.step;
    s.batch_size = info.batch;
    s.workers = static_cast<std::uint32_t>(comm_.size());
    s.learning_rate = info.learning_rate;
    s.next_learning_rate = info.next_learning_rate;
    s.last_step = last_;
    s.compressed_norm_sq.assign(levels, 0.0);
    for (std::size_t t = 0; t < grads.size(); ++t) {
      if (plan.accumulate_layers) {
        if (acc_[t].empty()) acc_[t].assign(grads[t].size(), 0.0f);
        for (std::size_t i = 0; i < grads[t].size(); ++i) acc_[t][i] += grads[t][i];
      }
      if (plan.report_layers) {
        s.layer_norms_sq.push_back(acc_[t].empty() ? 0.0 : norm_sq(acc_[t]));
        acc_[t].clear();
      }
      if (levels == 0) {  // a dense step: only the norm of g_ef is needed
        s.ef_norm_sq += ef_norm_sq(t, grads[t]);
        continue;
      }
      s.ef_norm_sq += compress_first(t, grads[t], codec_at(plan.measure[0]), step32);
      // base_ = decode(packet 0): with the residual it rebuilds g_ef, whatever is sent.
      base_[t].assign(grads[t].size(), 0.0f);
      codec_at(plan.measure[0])
          .decompress(std::span<std::byte const>(packets_[0][t]), std::span<float>(base_[t]), ctx_);
      s.compressed_norm_sq[0] += norm_sq(base_[t]);
      for (std::size_t l = 1; l < levels; ++l) {  // multi-level: compress the previous packet
        std::vector<float>& prev = scratch_[t];
        if (l == 1) prev = base_[t];
        gradcomp::any_codec const& c = codec_at(plan.measure[l]);
        auto& out = packets_[l][t];
        out.resize(c.max_compressed_bytes(prev.size()));
        gradcomp::codec_context ctx = ctx_;
        ctx.step = step32;
        out.resize(
            c.compress(gradcomp::tensor_view<float const>(std::span<float const>(prev),
                                                          static_cast<gradcomp::tensor_id>(t)),
                       std::span<std::byte>(out), ctx));
        std::fill(prev.begin(), prev.end(), 0.0f);
        c.decompress(std::span<std::byte const>(out), std::span<float>(prev), ctx_);
        s.compressed_norm_sq[l] += norm_sq(prev);
      }
    }
    rep.compress_s += seconds_since(t0);

    auto t1 = clock::now();
    agree(
        s,
        [&](std::span<double> v) {
          comm_.all_reduce(std::as_writable_bytes(v), gradcomp::comm_type::f64,
                           gradcomp::reduce_op::sum);
        },
        [&](std::span<double> v) {
          comm_.all_reduce(std::as_writable_bytes(v), gradcomp::comm_type::f64,
                           gradcomp::reduce_op::max);
        });
    rep.sync_s += seconds_since(t1);
    decision const d = ctrl_->decide(s);
    std::size_t const k = d.packet(levels);
    rep.factor = d.factor;

    if (k == decision::npos) {  // dense
      rep.sent = "dense";
      rep.gain = 1.0;
      auto t2 = clock::now();
      if (opts_.error_feedback) {
        for (std::size_t t = 0; t < grads.size(); ++t) {
          auto& st = ef_.state(static_cast<gradcomp::tensor_id>(t));
          // The residual before this step: r_old, or (after compressing) r + decode(packet 0) - g.
          std::vector<float> r_old = residual_before(t, grads[t], levels > 0);
          if (d.residual == residual_rule::keep) {
            st.data = std::move(r_old);  // send g, keep the residual for later
          } else {                       // send g_ef = g + r_old, residual zero
            if (!r_old.empty()) {
              for (std::size_t i = 0; i < grads[t].size(); ++i) grads[t][i] += r_old[i];
            }
            st.data.clear();
          }
        }
      }
      rep.compress_s += seconds_since(t2);
      dense_sum(grads, rep);
      return;
    }

    rep.sent = d.send == send_kind::candidate ? "candidate" : "minimum";
    double const ef = s.ef_norm_sq;
    rep.gain = ef > 0.0 ? s.compressed_norm_sq[k] / ef : 1.0;
    if (k != 0 &&
        opts_.error_feedback) {  // residual = g_ef - decode(packet k) = r + base - decode(k)
      auto t2 = clock::now();
      gradcomp::any_codec const& c = codec_at(plan.measure[k]);
      for (std::size_t t = 0; t < grads.size(); ++t) {
        auto& st = ef_.state(static_cast<gradcomp::tensor_id>(t));
        if (st.data.empty()) st.data.assign(grads[t].size(), 0.0f);
        for (std::size_t i = 0; i < grads[t].size(); ++i) st.data[i] += base_[t][i];
        c.decompress_add(std::span<std::byte const>(packets_[k][t]), std::span<float>(st.data),
                         -1.0f, ctx_);
      }
      rep.compress_s += seconds_since(t2);
    }
    send_packets(grads, k, codec_at(plan.measure[k]), rep);
  }

  // ‖g + residual‖² without touching the residual.
  double ef_norm_sq(std::size_t t, std::span<float const> g) {
    if (!opts_.error_feedback) return norm_sq(g);
    auto const r = ef_.state(static_cast<gradcomp::tensor_id>(t)).values();
    if (r.empty()) return norm_sq(g);
    double s = 0.0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      double const v = static_cast<double>(g[i]) + r[i];
      s += v * v;
    }
    return s;
  }

  // The residual of tensor t as it was before this step (empty = zero). After a compression
  // the state holds g_ef - decode(packet 0), so r_old = state + decode(packet 0) - g.
  std::vector<float> residual_before(std::size_t t, std::span<float const> g, bool compressed) {
    auto const r = ef_.state(static_cast<gradcomp::tensor_id>(t)).values();
    if (!compressed) return std::vector<float>(r.begin(), r.end());
    std::vector<float> out(g.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      out[i] = (r.empty() ? 0.0f : r[i]) + base_[t][i] - g[i];
    return out;
  }

  // All-gathers packet level `k` of every tensor (one collective for the sizes, one for the
  // bytes), then decodes every rank's packets in rank order into the gradients and divides by
  // the number of ranks.
  void send_packets(std::span<std::span<float> const> grads, std::size_t k,
                    gradcomp::any_codec const& c, exchange_report& rep) {
    std::size_t const tensors = grads.size();
    auto const n = static_cast<std::size_t>(comm_.size());
    auto t0 = clock::now();
    std::vector<std::uint64_t> mine(tensors);
    std::size_t mine_total = 0;
    for (std::size_t t = 0; t < tensors; ++t) {
      mine[t] = packets_[k][t].size();
      mine_total += packets_[k][t].size();
    }
    send_.resize(mine_total);
    std::size_t at = 0;
    for (std::size_t t = 0; t < tensors; ++t) {
      std::copy(packets_[k][t].begin(), packets_[k][t].end(),
                send_.begin() + static_cast<std::ptrdiff_t>(at));
      at += packets_[k][t].size();
    }
    std::vector<std::uint64_t> sizes(tensors * n);
    comm_.all_gather(std::as_bytes(std::span<std::uint64_t>(mine)),
                     std::as_writable_bytes(std::span<std::uint64_t>(sizes)));
    std::vector<std::size_t> counts(n, 0);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t t = 0; t < tensors; ++t)
        counts[r] += static_cast<std::size_t>(sizes[r * tensors + t]);
    }
    std::size_t total = 0;
    for (std::size_t cnt : counts) total += cnt;
    recv_.resize(total);
    comm_.all_gather_v(std::span<std::byte const>(send_), std::span<std::byte>(recv_), counts);
    rep.sync_s += seconds_since(t0);
    rep.bytes_sent += mine_total + tensors * sizeof(std::uint64_t);
    if (n > 1) {  // ring all-gathers: everything but the next rank's block, sizes included
      std::size_t const next = (static_cast<std::size_t>(comm_.rank()) + 1) % n;
      rep.wire_bytes += total - counts[next] + (n - 1) * tensors * sizeof(std::uint64_t);
    }

    auto t1 = clock::now();
    for (auto const& g : grads) std::fill(g.begin(), g.end(), 0.0f);
    at = 0;
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t t = 0; t < tensors; ++t) {
        auto const len = static_cast<std::size_t>(sizes[r * tensors + t]);
        c.decompress_add(std::span<std::byte const>(recv_).subspan(at, len), grads[t], 1.0f, ctx_);
        at += len;
      }
    }
    float const inv = 1.0f / static_cast<float>(n);
    for (auto const& g : grads) {
      for (float& v : g) v *= inv;
    }
    rep.compress_s += seconds_since(t1);
  }

  gradcomp::any_communicator comm_;
  exchange_options opts_;
  mode mode_ = mode::dense;
  gradcomp::codec_context ctx_;
  std::optional<gradcomp::any_codec> fixed_;
  std::optional<controller> ctrl_;
  std::map<double, gradcomp::any_codec> codecs_;
  gradcomp::compressor<gradcomp::any_codec, gradcomp::residual_feedback> ef_{
      gradcomp::make_codec("identity")};
  std::vector<std::vector<std::vector<std::byte>>> packets_;  // [level][tensor]
  std::vector<std::vector<float>> scratch_, base_, acc_;
  std::vector<float> flat_;
  std::vector<std::byte> send_, recv_;
  step_timing last_;
};

}  // namespace train
