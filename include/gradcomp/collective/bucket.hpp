// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Bucketing: many small layer tensors fused into few messages, with compression of one bucket
/// overlapping the communication of the previous one.
///
/// **Layout.** Tensors are taken in the order given. Those with fewer than
/// `min_compress_elements` elements go *dense* (float32 or 16-bit, `small_format`); the others
/// are compressed. Each class fills its own buckets of at most `bucket_bytes` float32 bytes (a
/// tensor larger than that gets a bucket of its own); buckets are issued in the order they
/// close. Every rank must pass the same tensors (sizes, ids, order): the layout is fingerprinted
/// and agreed once per call before any bucket moves.
///
/// **Compression.** `per_tensor`: each tensor of a bucket is compressed on its own (its own
/// packet, its own error feedback keyed by its tensor id), and the bucket's packets travel in
/// one message; the result is bit-identical to calling `all_reduce_compressed` per tensor.
/// `per_bucket`: the bucket's tensors are concatenated and compressed as one tensor whose id is
/// the id of the bucket's first tensor (its error feedback is keyed by that id); the result is
/// that of `all_reduce_compressed` on the concatenation.
///
/// **Messages per bucket.** Dense: one all-reduce. Compressed: one agreement round (status,
/// fingerprint, the packet sizes), then one all-reduce of the concatenated value sections
/// (summable, shared support) or one all-gather-v of the concatenated packets (gather).
/// Low-rank codecs are not bucketed (use one session per tensor).
///
/// **Pipeline.** With `pipeline` on, bucket i+1 is compressed while bucket i's payload is in
/// flight (non-blocking operations, two alternating buffer sets): post the agreement round of
/// bucket i, then its payload, then compress bucket i+1 and post its agreement round, then wait
/// for bucket i and decode it. All ranks post operations in the same order.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/sections.hpp>
#include <gradcomp/comm/request.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// How the tensors of a compressed bucket are compressed.
enum class bucket_compression : std::uint8_t {
  per_tensor = 0,  ///< one packet per tensor
  per_bucket = 1,  ///< one packet for the concatenated bucket
};

/// Options of `bucketed_all_reduce`.
struct bucket_options {
  /// Largest bucket in float32 bytes of gradient (a larger tensor gets a bucket of its own).
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Tensors with fewer elements go dense.
  std::size_t min_compress_elements = 4096;
  /// Format of the dense buckets.
  dense_format small_format = dense_format::f32;
  /// Per-tensor or per-bucket compression.
  bucket_compression mode = bucket_compression::per_tensor;
  /// Sum or average.
  reduction op = reduction::sum;
  /// Overlap compressing bucket i+1 with communicating bucket i.
  bool pipeline = true;
};

/// One tensor of a bucketed all-reduce: its gradient (as long as `out`) and its output.
struct bucket_item {
  tensor_view<float const> grad;
  std::span<float> out;
};

/// What a bucketed all-reduce did on this rank.
struct bucket_result {
  std::size_t buckets = 0;        ///< buckets issued
  std::size_t dense_buckets = 0;  ///< of which dense
  std::size_t packet_bytes = 0;   ///< this rank's compressed (or dense) payload bytes
  std::size_t wire_bytes = 0;     ///< modeled traffic of this rank (as `collective_result`)
};

namespace detail {

struct bucket_plan {
  bool dense = false;
  std::vector<std::size_t> items;
  std::size_t elements = 0;
};

inline std::vector<bucket_plan> plan_buckets(std::span<bucket_item const> items, bucket_options const& opt) {
  std::vector<bucket_plan> out;
  bucket_plan open[2];  // [0] compressed, [1] dense
  open[1].dense = true;
  std::size_t const limit = std::max<std::size_t>(opt.bucket_bytes / 4, 1);
  for (std::size_t i = 0; i < items.size(); ++i) {
    std::size_t const n = items[i].out.size();
    bucket_plan& b = open[n < opt.min_compress_elements ? 1 : 0];
    if (!b.items.empty() && b.elements + n > limit) {
      out.push_back(std::move(b));
      b = bucket_plan{};
      b.dense = n < opt.min_compress_elements;
    }
    b.items.push_back(i);
    b.elements += n;
  }
  // Close the remaining open buckets in the order of their first tensor.
  bool const dense_first = !open[1].items.empty() && (open[0].items.empty() || open[1].items[0] < open[0].items[0]);
  for (int k : {dense_first ? 1 : 0, dense_first ? 0 : 1}) {
    if (!open[k].items.empty()) out.push_back(std::move(open[k]));
  }
  return out;
}

struct bucket_unit {
  tensor_view<float const> grad;
  std::span<float> out;
};

struct bucket_slot {
  std::vector<bucket_unit> units;
  std::vector<float> fused_in, fused_out;
  std::vector<local_packet> packets;
  std::vector<std::byte> values;  // summable: concatenated value sections; gather: packets
  comm_type vtype = comm_type::f32;
  report_round round;
  rank_report mine;
  std::exception_ptr local;
  std::vector<std::uint64_t> sizes;
  std::vector<std::size_t> counts;
  std::vector<std::byte> gathered;
  request payload;
};

}  // namespace detail

/// Bucketed, pipelined compressed all-reduce over many tensors with one codec, `any_codec` or
/// `compressor` (see file comment). Owns `Source` (reach it with `source()`).
template <class Source>
  requires detail::packet_source<Source>
class bucketed_all_reduce {
 public:
  explicit bucketed_all_reduce(Source src, bucket_options opt = {}) : src_(std::move(src)), opt_(opt) {
    if (detail::aggregation_of(src_) == aggregation_kind::low_rank) {
      throw config_error("gradcomp: bucketed_all_reduce does not bucket low-rank codecs (use one low_rank_session "
                         "per tensor with all_reduce_low_rank)");
    }
  }

  [[nodiscard]] Source& source() noexcept { return src_; }
  [[nodiscard]] bucket_options const& options() const noexcept { return opt_; }

  /// All-reduces every item (collective: every rank passes the same layout).
  template <communicator Comm>
  bucket_result run(Comm& comm, std::span<bucket_item const> items, codec_context const& ctx = {}) {
    items_ = items;
    std::vector<detail::bucket_plan> plan;
    bucket_result res;
    // Agree on the layout and configuration once. A rank whose items are malformed still takes
    // part (with a failed status), so every rank stops here together.
    {
      rank_report mine;
      mine.count = items.size();
      mine.codec = static_cast<std::uint32_t>(detail::codec_id_of(src_));
      std::exception_ptr local;
      try {
        for (auto const& it : items) {
          if (it.grad.size() != it.out.size()) {
            throw config_error("gradcomp: bucketed_all_reduce: tensor " +
                               std::to_string(static_cast<unsigned>(it.grad.id())) + " has a gradient of " +
                               std::to_string(it.grad.size()) + " elements for an output of " +
                               std::to_string(it.out.size()));
          }
        }
        plan = detail::plan_buckets(items, opt_);
        fingerprint fp;
        fp.add("bucketed_all_reduce").add(plan.size()).add(opt_.bucket_bytes).add(opt_.min_compress_elements);
        fp.add(static_cast<std::uint64_t>(opt_.small_format)).add(static_cast<std::uint64_t>(opt_.mode));
        fp.add(static_cast<std::uint64_t>(opt_.op));
        for (auto const& b : plan) {
          fp.add(b.dense ? 1 : 0).add(b.items.size());
          for (std::size_t i : b.items) fp.add(items[i].out.size()).add(static_cast<std::uint64_t>(items[i].grad.id()));
        }
        fp.add(detail::codec_fingerprint(src_, 0, opt_.op, ctx, "bucket codec"));
        mine.fingerprint = fp.value();
      } catch (...) {
        local = std::current_exception();
        mine.status = 1;
      }
      detail::report_round round;
      round.post(comm, mine, {});
      round.finish("bucketed_all_reduce (layout)", local);
      res.wire_bytes += round.wire_bytes();
    }
    res.buckets = plan.size();
    alpha_ = detail::reduction_scale(opt_.op, comm.size());
    std::size_t const nb = plan.size();
    if (nb == 0) return res;
    if (!opt_.pipeline) {
      for (std::size_t i = 0; i < nb; ++i) {
        prepare(plan[i], items, slots_[0], ctx);
        post_first(comm, plan[i], slots_[0], res);
        advance(comm, plan[i], slots_[0], res);
        complete(plan[i], slots_[0], ctx);
      }
    } else {
      prepare(plan[0], items, slots_[0], ctx);
      post_first(comm, plan[0], slots_[0], res);
      for (std::size_t i = 1; i < nb; ++i) {
        detail::bucket_slot& prev = slots_[(i - 1) % 2];
        detail::bucket_slot& cur = slots_[i % 2];
        advance(comm, plan[i - 1], prev, res);  // payload of bucket i-1 in flight ...
        prepare(plan[i], items, cur, ctx);      // ... while bucket i is compressed
        post_first(comm, plan[i], cur, res);
        complete(plan[i - 1], prev, ctx);
      }
      advance(comm, plan[nb - 1], slots_[(nb - 1) % 2], res);
      complete(plan[nb - 1], slots_[(nb - 1) % 2], ctx);
    }
    for (auto const& b : plan) res.dense_buckets += b.dense ? 1 : 0;
    return res;
  }

 private:
  // Local work of a bucket: fuse, compress. Never communicates; failures go to s.local.
  void prepare(detail::bucket_plan const& b, std::span<bucket_item const> items, detail::bucket_slot& s,
               codec_context const& ctx) {
    s.units.clear();
    s.local = nullptr;
    s.mine = rank_report{};
    s.payload = request{};
    bool const fuse = b.dense || opt_.mode == bucket_compression::per_bucket;
    if (fuse) {
      s.fused_in.resize(b.elements);
      s.fused_out.resize(b.elements);
      std::size_t at = 0;
      for (std::size_t i : b.items) {
        auto const g = items[i].grad.span();
        if (!g.empty()) std::memcpy(s.fused_in.data() + at, g.data(), g.size_bytes());
        at += g.size();
      }
      tensor_id const id = items[b.items.front()].grad.id();
      s.units.push_back({tensor_view<float const>(std::span<float const>(s.fused_in), id), std::span<float>(s.fused_out)});
    } else {
      for (std::size_t i : b.items) s.units.push_back({items[i].grad, items[i].out});
    }
    if (b.dense) {
      if (opt_.small_format == dense_format::f32) {
        s.values.resize(b.elements * 4);
        if (b.elements != 0) std::memcpy(s.values.data(), s.fused_in.data(), b.elements * 4);
        s.vtype = comm_type::f32;
      } else {
        s.values.resize(header_bytes + 2 * b.elements);
        auto enc = [&](auto const& c) {
          c.compress(tensor_view<float const>(std::span<float const>(s.fused_in)), std::span<std::byte>(s.values), ctx);
        };
        if (opt_.small_format == dense_format::f16) enc(fp16_codec{});
        else enc(bf16_codec{});
        s.vtype = opt_.small_format == dense_format::f16 ? comm_type::f16 : comm_type::bf16;
      }
      return;
    }
    aggregation_kind const kind = detail::aggregation_of(src_);
    s.packets.resize(s.units.size());
    s.sizes.assign(s.units.size(), 0);
    fingerprint fp;
    fp.add(detail::codec_fingerprint(src_, b.elements, opt_.op, ctx, "bucket"));
    s.mine.codec = static_cast<std::uint32_t>(detail::codec_id_of(src_));
    s.mine.count = b.elements;
    try {
      std::size_t total = 0;
      for (std::size_t u = 0; u < s.units.size(); ++u) {
        detail::local_packet& p = s.packets[u];
        detail::compress_contribution(src_, kind, s.units[u].grad, s.units[u].out.size(), p, ctx);
        s.sizes[u] = p.bytes;
        if (kind == aggregation_kind::gather) {
          total += p.bytes;
        } else {
          p.add_frame(fp);
          if (u != 0 && p.section.type != s.packets[0].section.type) {
            throw config_error("gradcomp: bucketed_all_reduce: the tensors of a bucket have values of different types");
          }
          total += p.section.bytes;
        }
      }
      s.values.resize(total);
      std::size_t at = 0;
      for (auto& p : s.packets) {
        auto const src = kind == aggregation_kind::gather ? p.packet() : std::span<std::byte const>(p.values());
        if (!src.empty()) std::memcpy(s.values.data() + at, src.data(), src.size());
        at += src.size();
      }
      s.vtype = s.packets.empty() ? comm_type::f32 : detail::comm_type_of_dtype(s.packets[0].section.type);
    } catch (...) {
      s.local = std::current_exception();
      s.mine.status = 1;
      s.sizes.assign(s.units.size(), 0);
    }
    s.mine.fingerprint = fp.value();
  }

  // First operation of a bucket: the dense all-reduce, or the agreement round.
  template <communicator Comm>
  void post_first(Comm& comm, detail::bucket_plan const& b, detail::bucket_slot& s, bucket_result& res) {
    if (b.dense) {
      std::size_t const off = opt_.small_format == dense_format::f32 ? 0 : header_bytes;
      auto const v = std::span<std::byte>(s.values).subspan(off);
      s.payload = comm.iall_reduce(v, s.vtype, reduce_op::sum);
      res.packet_bytes += v.size();
      res.wire_bytes += detail::ring_all_reduce_bytes(v.size(), comm.size());
      return;
    }
    s.round.post(comm, s.mine, std::span<std::uint64_t const>(s.sizes));
  }

  // Second operation: after the agreement round, the payload of a compressed bucket.
  template <communicator Comm>
  void advance(Comm& comm, detail::bucket_plan const& b, detail::bucket_slot& s, bucket_result& res) {
    if (b.dense) return;
    s.round.finish("bucketed_all_reduce", s.local);
    res.wire_bytes += s.round.wire_bytes();
    aggregation_kind const kind = detail::aggregation_of(src_);
    if (kind == aggregation_kind::gather) {
      auto const w = static_cast<std::size_t>(comm.size());
      s.counts.assign(w, 0);
      std::size_t total = 0;
      for (std::size_t r = 0; r < w; ++r) {
        for (std::size_t u = 0; u < s.units.size(); ++u) s.counts[r] += static_cast<std::size_t>(s.round.extra(r, u));
        total += s.counts[r];
      }
      s.gathered.resize(total);
      res.packet_bytes += s.values.size();
      res.wire_bytes += detail::ring_all_gather_bytes(s.counts, comm.rank());
      s.payload = comm.iall_gather_v(std::span<std::byte const>(s.values), std::span<std::byte>(s.gathered),
                                     std::span<std::size_t const>(s.counts));
    } else {
      res.packet_bytes += s.values.size();
      res.wire_bytes += detail::ring_all_reduce_bytes(s.values.size(), comm.size());
      s.payload = comm.iall_reduce(std::span<std::byte>(s.values), s.vtype, reduce_op::sum);
    }
  }

  // Waits for the payload and decodes the bucket into the outputs.
  void complete(detail::bucket_plan const& b, detail::bucket_slot& s, codec_context const& ctx) {
    s.payload.wait();
    auto const& codec = detail::codec_of(src_);
    if (b.dense) {
      if (opt_.small_format == dense_format::f32) {
        if (!s.values.empty()) std::memcpy(s.units[0].out.data(), s.values.data(), s.values.size());
        if (alpha_ != 1.0f) {
          for (float& v : s.units[0].out) v *= alpha_;
        }
      } else {
        auto dec = [&](auto const& c) {
          auto const pkt = std::span<std::byte const>(s.values);
          if (alpha_ != 1.0f) {
            std::fill(s.units[0].out.begin(), s.units[0].out.end(), 0.0f);
            c.decompress_add(pkt, s.units[0].out, alpha_, ctx);
          } else {
            c.decompress(pkt, s.units[0].out, ctx);
          }
        };
        if (opt_.small_format == dense_format::f16) dec(fp16_codec{});
        else dec(bf16_codec{});
      }
    } else if (detail::aggregation_of(src_) == aggregation_kind::gather) {
      auto const w = s.counts.size();
      std::vector<std::size_t> start(w, 0);
      for (std::size_t r = 1; r < w; ++r) start[r] = start[r - 1] + s.counts[r - 1];
      std::vector<std::span<std::byte const>> packets(w);
      for (std::size_t u = 0; u < s.units.size(); ++u) {
        for (std::size_t r = 0; r < w; ++r) {
          auto const bytes = static_cast<std::size_t>(s.round.extra(r, u));
          packets[r] = std::span<std::byte const>(s.gathered).subspan(start[r], bytes);
          start[r] += bytes;
        }
        detail::decode_gathered(codec, std::span<std::span<std::byte const> const>(packets), s.units[u].out, alpha_, ctx);
      }
    } else {
      std::size_t at = 0;
      for (std::size_t u = 0; u < s.units.size(); ++u) {
        detail::local_packet& p = s.packets[u];
        if (p.section.bytes != 0) std::memcpy(p.values().data(), s.values.data() + at, p.section.bytes);
        at += p.section.bytes;
        detail::decode_summed(codec, p, s.units[u].out, alpha_, ctx);
      }
    }
    bool const fused = b.dense || opt_.mode == bucket_compression::per_bucket;
    if (fused) {
      std::size_t at = 0;
      for (std::size_t i = 0; i < b.items.size(); ++i) {
        auto const out = items_[b.items[i]].out;
        if (!out.empty()) std::memcpy(out.data(), s.fused_out.data() + at, out.size_bytes());
        at += out.size();
      }
    }
  }

  Source src_;
  bucket_options opt_;
  detail::bucket_slot slots_[2];
  float alpha_ = 1.0f;
  std::span<bucket_item const> items_;
};

GRADCOMP_NAMESPACE_END
