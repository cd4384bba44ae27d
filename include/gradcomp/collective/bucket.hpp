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
///
/// **Memory spaces.** The payloads — the fused buckets, the packets, the concatenated values
/// and gathered packets — live in the memory space of the source's codec
/// (collective/memory.hpp): host memory for the CPU codecs, device memory for a
/// `cuda::stream_codec` or `cuda::device_compressor` (cuda/collective.cuh), whose items are then
/// device tensors. Every copy into and out of a fused bucket and the scaling of an averaged
/// dense bucket go through the space's `copy` and `scale`; the layout, agreement and outcome
/// rounds stay host messages. A device source takes neither the `checksum` option (it reads
/// every payload on the host) nor a 16-bit `small_format` (the dense buckets are encoded by the
/// CPU's fp16/bf16 codecs), nor 16-bit items: a `config_error` on every rank at the layout
/// round, a compile-time error for 16-bit items.

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/dense.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/sections.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
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
  /// Integrity checks (collective/outcome.hpp): a CRC32C trailer on each rank's message of a
  /// gather bucket and on the agreement reports, a checksum of every summed bucket, the ranks'
  /// results compared; a mismatch is a `format_error` on every rank.
  bool checksum = false;
};

/// One tensor of a bucketed all-reduce: its gradient (as long as `out`) and its output, of
/// element type `T` (float, half or bfloat16).
template <element T>
struct basic_bucket_item {
  tensor_view<T const> grad;
  std::span<T> out;
};

/// A float32 tensor of a bucketed all-reduce.
using bucket_item = basic_bucket_item<float>;

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

template <class Items>
std::vector<bucket_plan> plan_buckets(Items const& items, bucket_options const& opt) {
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
  bool const dense_first =
      !open[1].items.empty() && (open[0].items.empty() || open[1].items[0] < open[0].items[0]);
  for (int k : {dense_first ? 1 : 0, dense_first ? 0 : 1}) {
    if (!open[k].items.empty()) out.push_back(std::move(open[k]));
  }
  return out;
}

struct bucket_unit {
  tensor_view<float const> grad;
  std::span<float> out;
};

/// The buffers and per-call state of one bucket in flight; its payload buffers (the fused
/// bucket, the packets, the concatenated values, the gathered packets) are in memory space
/// `Mem` (collective/memory.hpp).
template <class Mem>
struct basic_bucket_slot {
  std::vector<bucket_unit> units;
  typename Mem::buffer fused_in, fused_out;  // float32 elements of a fused bucket
  std::vector<basic_local_packet<Mem>> own;  // packets compressed here (bucketed_all_reduce)
  // The bucket's packets, one per unit (own or the caller's).
  std::vector<basic_local_packet<Mem>*> packets;
  typename Mem::buffer values;         // summable: concatenated value sections; gather: packets
  std::span<std::byte> payload_bytes;  // what the payload operation sends: `values`, or the one
                                       // packet's bytes when the bucket has a single unit
  comm_type vtype = comm_type::f32;
  report_round round;
  rank_report mine;
  std::exception_ptr local;
  std::vector<std::uint64_t> sizes;
  std::vector<std::size_t> counts;
  typename Mem::buffer gathered;
  request payload;
  bool bound = false;

  // Makes the payload buffers buffers of `mem` (a device space binds its stream), once.
  void bind(Mem const& mem) {
    if (bound) return;
    fused_in = mem.make_buffer();
    fused_out = mem.make_buffer();
    values = mem.make_buffer();
    gathered = mem.make_buffer();
    own.clear();
    bound = true;
  }
  // `n` packets of this slot's own, new ones made in `mem`.
  void own_packets(std::size_t n, Mem const& mem) {
    if (own.size() > n) own.erase(own.begin() + static_cast<std::ptrdiff_t>(n), own.end());
    while (own.size() < n) {
      own.emplace_back();
      own.back().buf = mem.make_buffer();
    }
  }
  // The fused bucket's float32 input and output, `n` elements each.
  void fuse(std::size_t n) {
    fused_in.resize(n * sizeof(float));
    fused_out.resize(n * sizeof(float));
  }

  // Completes (quietly) what is still in flight, so that no transport writes into the slot's
  // buffers, or the caller's packets, after a failed call has returned.
  void quiesce() noexcept {
    payload = request{};
    round = report_round{};
  }

  // Clears the per-call state (buffers keep their capacity).
  void reset() {
    units.clear();
    packets.clear();
    local = nullptr;
    mine = rank_report{};
    payload = request{};
    payload_bytes = {};
  }
};

/// The slot of host payloads.
using bucket_slot = basic_bucket_slot<host_memory>;

/// The message side of bucketing, shared by `bucketed_all_reduce` and the training pipeline
/// (pipeline/): dense buckets are fused and all-reduced; a compressed bucket's packets, made by
/// the caller, travel in one agreement round plus one payload operation, and are decoded into
/// the units' outputs. `run` issues the buckets with the pipelining of the file comment. The
/// payloads are in the codec's memory space (`memory_of`); the slots' buffers must be made in
/// it (`basic_bucket_slot::bind`; host buffers need nothing).
template <class Codec>
class bucket_engine {
 public:
  /// Where the payloads live.
  using memory_type = memory_of_t<Codec>;
  /// A bucket in flight.
  using slot_type = basic_bucket_slot<memory_type>;
  /// A packet of this engine's buckets.
  using packet_type = basic_local_packet<memory_type>;

  /// Decoding failures, the checksums of summed buckets and the outputs' CRC go to `check`,
  /// which the caller hands to `agree_outcome` once every bucket is done.
  bucket_engine(Codec const& codec, aggregation_kind kind, bucket_options const& opt, float alpha,
                step_check& check)
      : codec_(codec),
        kind_(kind),
        opt_(opt),
        alpha_(alpha),
        check_(check),
        mem_(memory_of(codec)) {}

  /// The memory space of the payloads.
  [[nodiscard]] memory_type const& memory() const noexcept { return mem_; }

  /// Issues every bucket of `plan`. `prepare(b, slot)` does the local work of bucket `b` —
  /// for a compressed bucket it fills `slot.units` and `slot.packets` and calls `assemble`
  /// (or records its failure in `slot.local` / `slot.mine.status`), for a dense one
  /// `prepare_dense` — and never communicates. `done(b, slot)` runs after bucket `b` is decoded.
  template <communicator Comm, class Prepare, class Done>
  void run(Comm& comm, std::span<bucket_plan const> plan, slot_type (&slots)[2], Prepare&& prepare,
           Done&& done, bucket_result& res) {
    std::size_t const nb = plan.size();
    if (nb == 0) return;
    try {
      run_buckets(comm, plan, slots, prepare, done, res);
    } catch (...) {
      for (slot_type& s : slots) s.quiesce();
      throw;
    }
    for (auto const& b : plan) res.dense_buckets += b.dense ? 1 : 0;
  }

 private:
  template <communicator Comm, class Prepare, class Done>
  void run_buckets(Comm& comm, std::span<bucket_plan const> plan, slot_type (&slots)[2],
                   Prepare& prepare, Done& done, bucket_result& res) {
    std::size_t const nb = plan.size();
    auto finish = [&](std::size_t i, slot_type& s) {
      complete(plan[i], s);
      done(i, s);
    };
    if (!opt_.pipeline) {
      for (std::size_t i = 0; i < nb; ++i) {
        prepare(i, slots[0]);
        post_first(comm, plan[i], slots[0], res);
        advance(comm, plan[i], slots[0], res);
        finish(i, slots[0]);
      }
    } else {
      prepare(0, slots[0]);
      post_first(comm, plan[0], slots[0], res);
      for (std::size_t i = 1; i < nb; ++i) {
        slot_type& prev = slots[(i - 1) % 2];
        slot_type& cur = slots[i % 2];
        advance(comm, plan[i - 1], prev, res);  // payload of bucket i-1 in flight ...
        prepare(i, cur);                        // ... while bucket i is compressed
        post_first(comm, plan[i], cur, res);
        finish(i - 1, prev);
      }
      advance(comm, plan[nb - 1], slots[(nb - 1) % 2], res);
      finish(nb - 1, slots[(nb - 1) % 2]);
    }
  }

 public:
  /// Fuses `b`'s inputs (`grad_of(i)`: item i's float32 input, in the payloads' memory space,
  /// empty for none) into `s.fused_in`, through the memory space's `copy`.
  template <class GradOf>
  void fuse(bucket_plan const& b, slot_type& s, GradOf&& grad_of) const {
    s.fuse(b.elements);
    std::size_t at = 0;
    for (std::size_t i : b.items) {
      std::span<float const> const g = grad_of(i);
      mem_.copy(s.fused_in.span().subspan(at * sizeof(float), g.size_bytes()), std::as_bytes(g));
      at += g.size();
    }
  }

  /// Dense bucket: fuses the items' gradients (`grad_of(i)`: item i's float32 input, empty for
  /// none) and encodes them in the bucket's dense format (in device memory: float32 only).
  template <class GradOf>
  void prepare_dense(bucket_plan const& b, slot_type& s, GradOf&& grad_of,
                     codec_context const& ctx) {
    fuse(b, s, grad_of);
    std::span<float const> const in = float_span(s.fused_in, b.elements);
    s.units.push_back({tensor_view<float const>(in), float_span(s.fused_out, b.elements)});
    if (opt_.small_format == dense_format::f32) {
      s.values.resize(b.elements * 4);
      mem_.copy(s.values.span(), std::as_const(s.fused_in).span());
      s.vtype = comm_type::f32;
    } else {
      if constexpr (memory_type::on_host) {
        s.values.resize(header_bytes + 2 * b.elements);
        auto enc = [&](auto const& c) {
          c.compress(tensor_view<float const>(in), s.values.span(), ctx);
        };
        if (opt_.small_format == dense_format::f16)
          enc(fp16_codec{});
        else
          enc(bf16_codec{});
        s.vtype = opt_.small_format == dense_format::f16 ? comm_type::f16 : comm_type::bf16;
      } else {
        (void)ctx;
        throw config_error(device_dense_format_message);
      }
    }
    s.payload_bytes =
        s.values.span().subspan(opt_.small_format == dense_format::f32 ? 0 : header_bytes);
  }

  /// Compressed bucket whose `s.packets` are filled: checks them, adds their frames to `fp`,
  /// and lays out the payload (a single packet is sent from where it is, without a copy).
  /// Failures go to `s.local` and the round's status, as compression failures do.
  void assemble(slot_type& s, fingerprint& fp, std::size_t elements) {
    s.mine.codec = static_cast<std::uint32_t>(id_of_codec(codec_));
    s.mine.count = elements;
    s.sizes.assign(s.packets.size(), 0);
    if (s.local) {
      s.mine.status = 1;
      s.mine.fingerprint = fp.value();
      return;
    }
    try {
      std::size_t total = 0;
      for (std::size_t u = 0; u < s.packets.size(); ++u) {
        packet_type& p = *s.packets[u];
        s.sizes[u] = p.bytes;
        if (kind_ == aggregation_kind::gather) {
          total += p.bytes;
        } else {
          p.add_frame(fp, mem_);
          if (u != 0 && p.section.type != s.packets[0]->section.type) {
            throw config_error(
                "gradcomp: bucketed_all_reduce: the tensors of a bucket have values of different "
                "types");
          }
          total += p.section.bytes;
        }
      }
      auto bytes_of = [&](packet_type& p) {
        return kind_ == aggregation_kind::gather ? p.buf.span().first(p.bytes) : p.values();
      };
      // A lone packet is sent from where it is (an all-reduce sums into it). Under the
      // checksum option (host payloads only) a gather bucket's message ends with the CRC32C of
      // its packets.
      bool const trailer =
          memory_type::on_host && opt_.checksum && kind_ == aggregation_kind::gather;
      if (s.packets.size() == 1 && !trailer) {
        s.payload_bytes = bytes_of(*s.packets[0]);
      } else {
        s.values.resize(total + (trailer ? checksum_trailer_bytes : 0));
        std::size_t at = 0;
        for (packet_type* p : s.packets) {
          auto const src = bytes_of(*p);
          mem_.copy(s.values.span().subspan(at, src.size()), src);
          at += src.size();
        }
        if constexpr (memory_type::on_host) {
          if (trailer) add_trailer(s.values.span(), total);
        }
        s.payload_bytes = s.values.span();
      }
      s.vtype = s.packets.empty() ? comm_type::f32 : comm_type_of_dtype(s.packets[0]->section.type);
    } catch (...) {
      s.local = std::current_exception();
      s.mine.status = 1;
      s.sizes.assign(s.packets.size(), 0);
    }
    s.mine.fingerprint = fp.value();
  }

 private:
  // First operation of a bucket: the dense all-reduce, or the agreement round.
  template <communicator Comm>
  void post_first(Comm& comm, bucket_plan const& b, slot_type& s, bucket_result& res) {
    if (b.dense) {
      if constexpr (memory_type::on_host) check_.before_sum(s.payload_bytes, s.vtype);
      s.payload = comm.iall_reduce(s.payload_bytes, s.vtype, reduce_op::sum);
      res.packet_bytes += s.payload_bytes.size();
      res.wire_bytes += ring_all_reduce_bytes(s.payload_bytes.size(), comm.size());
      return;
    }
    // A bucket decoded before failed here: say so in this round, so every rank stops now.
    if (check_.failed() && !s.local) {
      s.local = check_.failure();
      s.mine.status = 1;
    }
    s.round.post(comm, s.mine, std::span<std::uint64_t const>(s.sizes), opt_.checksum,
                 "bucketed_all_reduce");
  }

  // Second operation: after the agreement round, the payload of a compressed bucket.
  template <communicator Comm>
  void advance(Comm& comm, bucket_plan const& b, slot_type& s, bucket_result& res) {
    if (b.dense) return;
    s.round.finish("bucketed_all_reduce", s.local);
    res.wire_bytes += s.round.wire_bytes();
    res.packet_bytes += s.payload_bytes.size();
    if (kind_ == aggregation_kind::gather) {
      auto const w = static_cast<std::size_t>(comm.size());
      for (std::size_t u = 0; u < s.units.size(); ++u) {
        s.round.check_sizes("bucketed_all_reduce",
                            codec_.max_compressed_bytes(s.units[u].out.size()), s.sizes[u], u);
      }
      s.counts.assign(w, 0);
      std::size_t total = 0;
      for (std::size_t r = 0; r < w; ++r) {
        for (std::size_t u = 0; u < s.units.size(); ++u)
          s.counts[r] += static_cast<std::size_t>(s.round.extra(r, u));
        if (opt_.checksum) s.counts[r] += checksum_trailer_bytes;
        total += s.counts[r];
      }
      s.gathered.resize(total);
      res.wire_bytes += ring_all_gather_bytes(s.counts, comm.rank());
      s.payload = comm.iall_gather_v(std::span<std::byte const>(s.payload_bytes), s.gathered.span(),
                                     std::span<std::size_t const>(s.counts));
    } else {
      res.wire_bytes += ring_all_reduce_bytes(s.payload_bytes.size(), comm.size());
      if constexpr (memory_type::on_host) check_.before_sum(s.payload_bytes, s.vtype);
      s.payload = comm.iall_reduce(s.payload_bytes, s.vtype, reduce_op::sum);
    }
  }

  // Waits for the payload and decodes the bucket into the units' outputs. A decoding failure
  // is recorded in the step check (this rank goes on with the other buckets' messages; the
  // outcome round, or the next bucket's agreement round, makes every rank fail).
  void complete(bucket_plan const& b, slot_type& s) {
    s.payload.wait();
    if constexpr (memory_type::on_host) {
      if (b.dense || kind_ != aggregation_kind::gather) check_.after_sum(s.payload_bytes, s.vtype);
    }
    auto const t0 = std::chrono::steady_clock::now();
    decode_timer timer{t0, decode_s};
    check_.guard([&] { decode(b, s); });
    if (check_.failed()) return;
    if constexpr (memory_type::on_host) {
      if (b.dense || opt_.mode == bucket_compression::per_bucket) {
        check_.output(std::span<float const>(float_span(s.fused_out, b.elements)));
      } else {
        for (auto const& u : s.units) check_.output(u.out);
      }
    }
  }

  void decode(bucket_plan const& b, slot_type& s) {
    codec_context const& ctx = ctx_;
    if (b.dense) {
      if (opt_.small_format == dense_format::f32) {
        mem_.copy(std::as_writable_bytes(s.units[0].out), std::as_const(s.values).span());
        if (alpha_ != 1.0f) mem_.scale(s.units[0].out, alpha_);
      } else if constexpr (memory_type::on_host) {
        auto dec = [&](auto const& c) {
          auto const pkt = std::as_const(s.values).span();
          if (alpha_ != 1.0f) {
            std::fill(s.units[0].out.begin(), s.units[0].out.end(), 0.0f);
            c.decompress_add(pkt, s.units[0].out, alpha_, ctx);
          } else {
            c.decompress(pkt, s.units[0].out, ctx);
          }
        };
        if (opt_.small_format == dense_format::f16)
          dec(fp16_codec{});
        else
          dec(bf16_codec{});
      } else {
        throw config_error(device_dense_format_message);
      }
    } else if (kind_ == aggregation_kind::gather) {
      auto const w = s.counts.size();
      std::span<std::byte const> const gathered = std::as_const(s.gathered).span();
      std::vector<std::size_t> start(w, 0);
      for (std::size_t r = 1; r < w; ++r) start[r] = start[r - 1] + s.counts[r - 1];
      if constexpr (memory_type::on_host) {
        if (opt_.checksum) {
          for (std::size_t r = 0; r < w; ++r) {
            (void)strip_trailer(gathered.subspan(start[r], s.counts[r]), "bucketed_all_reduce");
          }
        }
      }
      std::vector<std::span<std::byte const>> packets(w);
      for (std::size_t u = 0; u < s.units.size(); ++u) {
        for (std::size_t r = 0; r < w; ++r) {
          auto const bytes = static_cast<std::size_t>(s.round.extra(r, u));
          packets[r] = gathered.subspan(start[r], bytes);
          start[r] += bytes;
        }
        decode_gathered(codec_, std::span<std::span<std::byte const> const>(packets),
                        s.units[u].out, alpha_, ctx, mem_);
      }
    } else {
      bool const in_place =
          s.payload_bytes.data() != s.values.data();  // summed in the packet itself
      std::size_t at = 0;
      for (std::size_t u = 0; u < s.units.size(); ++u) {
        packet_type* p = s.packets[u];
        if (!in_place)
          mem_.copy(p->values(), std::as_const(s.values).span().subspan(at, p->section.bytes));
        at += p->section.bytes;
        decode_summed(codec_, *p, s.units[u].out, alpha_, ctx, mem_);
      }
    }
  }

 public:
  /// The context decoding uses (set before `run`).
  codec_context ctx_;
  /// Seconds spent decoding (after the payloads arrived), over `run`.
  double decode_s = 0.0;

 private:
  struct decode_timer {
    std::chrono::steady_clock::time_point t0;
    double& total;
    ~decode_timer() {
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };

 private:
  static constexpr char const* device_dense_format_message =
      "gradcomp: bucketed_all_reduce: a device source's dense buckets are float32 (small_format "
      "f16 and "
      "bf16 encode on the host)";

  Codec const& codec_;
  aggregation_kind kind_;
  bucket_options const& opt_;
  float alpha_;
  step_check& check_;
  memory_type mem_;
};

/// Copies a fused bucket's output back to its items' outputs (in memory space `mem`).
template <class Mem, class Items>
void scatter_fused(bucket_plan const& b, basic_bucket_slot<Mem> const& s, Items const& items,
                   Mem const& mem = {}) {
  std::size_t at = 0;
  for (std::size_t i : b.items) {
    auto const out = items[i].out;
    mem.copy(std::as_writable_bytes(out),
             s.fused_out.span().subspan(at * sizeof(float), out.size_bytes()));
    at += out.size();
  }
}

/// Checks the items, plans the buckets and agrees the layout and configuration once (one
/// round); a rank whose items are malformed still takes part (with a failed status), so every
/// rank stops here together. `src` fixes the codec part of the fingerprint.
template <communicator Comm, class Items, class Src>
std::vector<bucket_plan> agree_layout(Comm& comm, Items const& items, bucket_options const& opt,
                                      Src const& src, codec_context const& ctx,
                                      bucket_result& res) {
  std::vector<bucket_plan> plan;
  rank_report mine;
  mine.count = items.size();
  mine.codec = static_cast<std::uint32_t>(codec_id_of(src));
  std::exception_ptr local;
  try {
    for (auto const& it : items) {
      if (it.grad.size() != it.out.size()) {
        throw config_error("gradcomp: bucketed_all_reduce: tensor " +
                           std::to_string(static_cast<unsigned>(it.grad.id())) +
                           " has a gradient of " + std::to_string(it.grad.size()) +
                           " elements for an output of " + std::to_string(it.out.size()));
      }
    }
    if constexpr (!host_payloads<Src>) {
      if (opt.checksum) {
        throw config_error(
            std::string("gradcomp: bucketed_all_reduce: codec '") + codec_name(codec_id_of(src)) +
            "' keeps its packets in device memory; the checksum option reads every payload on the "
            "host and is available for host codecs only");
      }
      if (opt.small_format != dense_format::f32) {
        throw config_error(
            std::string("gradcomp: bucketed_all_reduce: codec '") + codec_name(codec_id_of(src)) +
            "' keeps its packets in device memory; its dense buckets are float32 (small_format f16 "
            "and bf16 encode on the host)");
      }
    }
    plan = plan_buckets(items, opt);
    fingerprint fp;
    fp.add("bucketed_all_reduce")
        .add(plan.size())
        .add(opt.bucket_bytes)
        .add(opt.min_compress_elements);
    fp.add(static_cast<std::uint64_t>(opt.small_format)).add(static_cast<std::uint64_t>(opt.mode));
    fp.add(static_cast<std::uint64_t>(opt.op));
    if (opt.checksum) fp.add("checksum");
    for (auto const& b : plan) {
      fp.add(b.dense ? 1 : 0).add(b.items.size());
      for (std::size_t i : b.items)
        fp.add(items[i].out.size()).add(static_cast<std::uint64_t>(items[i].grad.id()));
    }
    fp.add(codec_fingerprint(src, 0, opt.op, ctx, "bucket codec"));
    mine.fingerprint = fp.value();
  } catch (...) {
    local = std::current_exception();
    mine.status = 1;
  }
  report_round round;
  round.post(comm, mine, {}, opt.checksum, "bucketed_all_reduce (layout)");
  round.finish("bucketed_all_reduce (layout)", local);
  res.wire_bytes += round.wire_bytes();
  return plan;
}

}  // namespace detail

/// Bucketed, pipelined compressed all-reduce over many tensors with one codec, `any_codec` or
/// `compressor` (see file comment). Owns `Source` (reach it with `source()`). A device source
/// (`cuda::stream_codec<C>`, `cuda::device_compressor<C>`) takes device tensors and keeps every
/// payload on the device; its results are byte for byte those of the CPU codec of the same
/// format. Its payload buffers are made on the source's stream at the first `run`: keep that
/// stream for the object's life.
template <class Source>
  requires detail::packet_source<Source>
class bucketed_all_reduce {
 public:
  /// Where the payloads live (collective/memory.hpp): the source's codec's memory space.
  using memory_type = detail::memory_of_t<Source>;
  explicit bucketed_all_reduce(Source src, bucket_options opt = {})
      : src_(std::move(src)), opt_(opt) {
    if (detail::aggregation_of(src_) == aggregation_kind::low_rank) {
      throw config_error(
          "gradcomp: bucketed_all_reduce does not bucket low-rank codecs (use one low_rank_session "
          "per tensor with all_reduce_low_rank)");
    }
  }

  [[nodiscard]] Source& source() noexcept { return src_; }
  [[nodiscard]] bucket_options const& options() const noexcept { return opt_; }

  /// All-reduces every item (collective: every rank passes the same layout).
  template <communicator Comm>
  bucket_result run(Comm& comm, std::span<bucket_item const> items, codec_context const& ctx = {}) {
    bucket_result res;
    std::vector<detail::bucket_plan> const plan =
        detail::agree_layout(comm, items, opt_, src_, ctx, res);
    res.buckets = plan.size();
    aggregation_kind const kind = detail::aggregation_of(src_);
    detail::step_check check(opt_.checksum);
    detail::pending_commit<Source> pending(src_);
    using engine_type =
        detail::bucket_engine<std::remove_cvref_t<decltype(detail::codec_of(src_))>>;
    static_assert(std::same_as<typename engine_type::memory_type, memory_type>);
    engine_type engine(detail::codec_of(src_), kind, opt_,
                       detail::reduction_scale(opt_.op, comm.size()), check);
    engine.ctx_ = ctx;
    memory_type const& mem = engine.memory();
    for (auto& s : slots_) s.bind(mem);
    auto prepare = [&](std::size_t bi, slot_type& s) {
      detail::bucket_plan const& b = plan[bi];
      s.reset();
      auto const grad_of = [&](std::size_t i) { return items[i].grad.span(); };
      if (b.dense) {
        engine.prepare_dense(b, s, grad_of, ctx);
        return;
      }
      if (opt_.mode == bucket_compression::per_bucket) {
        engine.fuse(b, s, grad_of);
        tensor_id const id = items[b.items.front()].grad.id();
        s.units.push_back(
            {tensor_view<float const>(
                 std::span<float const>(detail::float_span(s.fused_in, b.elements)), id),
             detail::float_span(s.fused_out, b.elements)});
      } else {
        for (std::size_t i : b.items) s.units.push_back({items[i].grad, items[i].out});
      }
      fingerprint fp;
      fp.add(detail::codec_fingerprint(src_, b.elements, opt_.op, ctx, "bucket"));
      s.own_packets(s.units.size(), mem);
      try {
        for (std::size_t u = 0; u < s.units.size(); ++u) {
          detail::compress_contribution(src_, kind, s.units[u].grad, s.units[u].out.size(),
                                        s.own[u], ctx, &pending);
          s.packets.push_back(&s.own[u]);
        }
      } catch (...) {
        s.local = std::current_exception();
        s.packets.clear();
        for (auto& p : s.own) s.packets.push_back(&p);
      }
      engine.assemble(s, fp, b.elements);
    };
    auto done = [&](std::size_t bi, slot_type& s) {
      detail::bucket_plan const& b = plan[bi];
      if (b.dense || opt_.mode == bucket_compression::per_bucket)
        detail::scatter_fused(b, s, items, mem);
    };
    engine.run(comm, std::span<detail::bucket_plan const>(plan), slots_, prepare, done, res);
    // Nothing is committed (residuals, EF21 receivers) unless every rank decoded every bucket.
    detail::agree_outcome(comm, check, "bucketed_all_reduce");
    res.wire_bytes += detail::outcome_wire_bytes(opt_.checksum, comm.size());
    pending.apply();
    if constexpr (requires(Source & x, tensor_id id, std::span<float> o) { x.receive(id, o); }) {
      receive_outputs(plan, items, mem);
    }
    return res;
  }

  /// All-reduces 16-bit items (`half` or `bfloat16`): every gradient is widened to float32
  /// (exact) and the float32 run above does the work (same layout, buckets, error feedback and
  /// float32 sums); each output is then the float32 result rounded once. Bit-identical to
  /// `run` on the widened gradients, rounded once. Outputs are written only on success.
  template <communicator Comm, element T>
    requires(!std::same_as<T, float>)
  bucket_result run(Comm& comm, std::span<basic_bucket_item<T> const> items,
                    codec_context const& ctx = {}) {
    static_assert(memory_type::on_host,
                  "bucketed_all_reduce of 16-bit items widens them on the host: pass float32 "
                  "device tensors to a "
                  "device source");
    // A matched item is reduced in place in its float32 copy (each tensor is compressed, or
    // copied into its bucket, before its output is written); a malformed one (sizes differ)
    // keeps its sizes, so the float32 run's layout agreement rejects it on every rank.
    std::size_t total = 0;
    for (auto const& it : items)
      total += it.grad.size() + (it.grad.size() != it.out.size() ? it.out.size() : 0);
    wide_.resize(total);
    std::vector<bucket_item> wide_items;
    wide_items.reserve(items.size());
    std::vector<std::size_t> out_at;
    out_at.reserve(items.size());
    std::size_t at = 0;
    for (auto const& it : items) {
      std::span<float> const g = std::span<float>(wide_).subspan(at, it.grad.size());
      detail::widen_to_f32(it.grad.span(), g, ctx);
      at += it.grad.size();
      std::span<float> o = g;
      if (it.grad.size() != it.out.size()) {
        o = std::span<float>(wide_).subspan(at, it.out.size());
        at += it.out.size();
      }
      out_at.push_back(static_cast<std::size_t>(o.data() - wide_.data()));
      wide_items.push_back({tensor_view<float const>(std::span<float const>(g), it.grad.id()), o});
    }
    bucket_result const res = run(comm, std::span<bucket_item const>(wide_items), ctx);
    for (std::size_t i = 0; i < items.size(); ++i) {
      detail::round_from_f32(std::span<float const>(wide_).subspan(out_at[i], items[i].out.size()),
                             items[i].out, ctx);
    }
    return res;
  }

 private:
  // The receiver side of an increment policy (EF21) turns each compressed output into the
  // estimate, once the step has succeeded: per tensor, or per concatenated bucket (gathered in
  // a buffer of the payloads' memory space and copied back, through its `copy`).
  void receive_outputs(std::vector<detail::bucket_plan> const& plan,
                       std::span<bucket_item const> items, memory_type const& mem) {
    for (auto const& b : plan) {
      if (b.dense) continue;
      if (opt_.mode == bucket_compression::per_tensor) {
        for (std::size_t i : b.items)
          detail::receive_output(src_, items[i].grad.id(), items[i].out);
        continue;
      }
      typename memory_type::buffer fused = mem.make_buffer();
      fused.resize(b.elements * sizeof(float));
      std::size_t at = 0;
      for (std::size_t i : b.items) {
        mem.copy(fused.span().subspan(at, items[i].out.size_bytes()), std::as_bytes(items[i].out));
        at += items[i].out.size_bytes();
      }
      detail::receive_output(src_, items[b.items.front()].grad.id(), detail::float_span(fused, b.elements));
      at = 0;
      for (std::size_t i : b.items) {
        mem.copy(std::as_writable_bytes(items[i].out), std::as_const(fused).span().subspan(at, items[i].out.size_bytes()));
        at += items[i].out.size_bytes();
      }
    }
  }

  using slot_type = detail::basic_bucket_slot<memory_type>;

  Source src_;
  bucket_options opt_;
  slot_type slots_[2];
  std::vector<float> wide_;  // the float32 copies of 16-bit items
};

GRADCOMP_NAMESPACE_END
