// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Two-way compression (BytePS-Compress; DeepSpeed's compressed all-reduce): gradients are
/// compressed on the way to the reducer *and* on the way back, each direction with its own
/// error feedback.
///
/// `all_reduce_two_way` (every rank a worker and the server of one shard):
/// 1. the tensor is split into `size()` contiguous shards (shard s = [n s / W, n (s+1) / W));
/// 2. each rank compresses every shard with its *worker* error feedback (one residual per
///    tensor and shard) and sends shard s to rank s (an all-to-all-v: the reduce-scatter of
///    compressed shards);
/// 3. rank s decompresses the W packets of its shard, sums them in rank order (times 1/W for
///    `reduction::average`), and re-compresses the sum with its *server* error feedback (a
///    second residual per tensor and shard);
/// 4. the server packets are all-gathered; every rank decompresses all of them into the result.
///
/// Every rank ends with the same bits. Each phase starts with an agreement round (the
/// configuration fingerprint, the local status, the packet sizes), so a disagreement or a
/// failed compression on any rank makes every rank throw rather than diverge.
///
/// Mass conservation holds on both sides: for each shard, what a worker sent plus its residual
/// equals its gradients plus its first residual, and what the server sent plus its residual
/// equals what it received (the summed, scaled worker packets), step after step.
///
/// The codec's random streams are keyed by a tensor id derived from (tensor id, shard, side),
/// so shards draw independent numbers, and workers share a stream for the same shard (what a
/// shared-support codec needs). A server whose codec has shared support (random-k) compresses
/// on the *workers'* stream of its shard, so it selects the support the workers' packets
/// share: the sum of the workers' packets is zero off that support, and the server sends all
/// of it (lossless with f32 values, as BytePS's sparse server sum). On a stream of its own
/// only about k²/n of the k coordinates would survive the step.
///
/// Device codecs (cuda/collective.cuh's `stream_codec`) go through the same code: the payloads
/// (worker packets, the received shards, the server's sum, the server packets gathered) live
/// in the codec's memory space (collective/memory.hpp), and the default error feedback is the
/// codec's own (`residual_feedback_for`: for a `stream_codec`, residuals in device memory).
/// The agreement and outcome rounds stay host messages, and no payload byte is read on the host
/// by this file (the codecs read their packet headers). A device codec takes neither the
/// `checksum` option (a `config_error` on every rank) nor 16-bit gradients (pass float32); its
/// compressor's state is saved and loaded through host copies (`save`, `load`).

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/common.hpp>
#include <gradcomp/collective/memory.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/concepts/codec.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/feedback.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/feedback/policies.hpp>

#include <algorithm>
#include <compare>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Identifies one shard of one tensor: the key of a shard's error-feedback state.
struct shard_key {
  tensor_id tensor{0};       ///< the tensor
  std::uint32_t shard = 0;   ///< shard index
  std::uint32_t shards = 1;  ///< number of shards the tensor was split into

  friend constexpr auto operator<=>(shard_key const&, shard_key const&) = default;
};

/// Which side of a two-way exchange compresses.
enum class two_way_side : std::uint8_t { worker = 0, server = 1 };

/// Tensor id of the codec's random stream for shard `k` on side `side`.
constexpr tensor_id shard_stream_id(shard_key const& k, two_way_side side) noexcept {
  std::uint32_t x = static_cast<std::uint32_t>(k.tensor) * 0x9E3779B1u;
  x ^= (k.shard + 1u) * 0x85EBCA77u;
  x ^= (k.shards + 1u) * 0x27D4EB2Fu;
  x ^= (static_cast<std::uint32_t>(side) + 1u) * 0xC2B2AE3Du;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return static_cast<tensor_id>(x);
}

/// Element range [first, second) of shard `s` of `shards` over n elements.
constexpr std::pair<std::size_t, std::size_t> shard_range(std::size_t n, std::size_t s, std::size_t shards) noexcept {
  return {n / shards * s + n % shards * s / shards, n / shards * (s + 1) + n % shards * (s + 1) / shards};
}

/// The state of two-way compression: the worker and server codecs (the same codec by default)
/// and both sides' error feedback, per tensor shard. One object per rank; it serves both
/// `all_reduce_two_way` and the parameter-server functions (collective/parameter_server.hpp).
/// The feedback is residual feedback by default (the codec's own, `residual_feedback_for`);
/// any `one_phase_feedback` policy works. With a device codec every span it is handed (shards,
/// packets, `out`) and every residual it returns is device memory (file comment).
template <codec_operations Codec, class WorkerFeedback = residual_feedback_for<Codec>,
          class ServerFeedback = residual_feedback_for<Codec>>
  requires one_phase_feedback<WorkerFeedback, Codec> && one_phase_feedback<ServerFeedback, Codec>
class two_way_compressor {
 public:
  using codec_type = Codec;
  /// Where the codecs' payloads and the server's sum live (collective/memory.hpp).
  using memory_type = detail::memory_of_t<Codec>;

  /// Both sides use `c`.
  two_way_compressor()
    requires std::default_initializable<Codec>
      : two_way_compressor(Codec{}) {}
  explicit two_way_compressor(Codec c, WorkerFeedback wf = WorkerFeedback{}, ServerFeedback sf = ServerFeedback{})
      : worker_codec_(c), server_codec_(std::move(c)), wf_(std::move(wf)), sf_(std::move(sf)) {}
  /// Workers use `worker`, servers `server`.
  two_way_compressor(Codec worker, Codec server, WorkerFeedback wf = WorkerFeedback{}, ServerFeedback sf = ServerFeedback{})
      : worker_codec_(std::move(worker)), server_codec_(std::move(server)), wf_(std::move(wf)), sf_(std::move(sf)) {}

  /// The workers' codec (assign to change it between steps; residuals carry over).
  [[nodiscard]] Codec& worker_codec() noexcept { return worker_codec_; }
  [[nodiscard]] Codec const& worker_codec() const noexcept { return worker_codec_; }
  /// The servers' codec.
  [[nodiscard]] Codec& server_codec() noexcept { return server_codec_; }
  [[nodiscard]] Codec const& server_codec() const noexcept { return server_codec_; }

  /// Worker side: compresses shard `x` of `key` with the worker error feedback into `out`
  /// (at least `worker_codec().max_compressed_bytes(x.size())` bytes); returns the packet size.
  std::size_t compress_shard(std::span<float const> x, shard_key const& key, std::span<std::byte> out,
                             codec_context const& ctx) {
    tensor_view<float const> const v(x, shard_stream_id(key, two_way_side::worker));
    return compress_with(wf_, worker_codec_, worker_states_, worker_undo_, key, v, out, ctx);
  }

  /// Server side: decompresses the non-empty `packets` (worker packets of one shard of `n`
  /// elements), sums them in order, multiplies the sum by `scale`, and compresses it with the
  /// server error feedback of `key` into `out` (at least `server_codec().max_compressed_bytes(n)`
  /// bytes); returns the packet size. `received`, if given, gets the scaled sum (on the host:
  /// with a device codec, a copy made after the sum is complete). A shared-support server codec
  /// compresses on the workers' stream of `key` (file comment). The sum is kept in the codec's
  /// memory space, in a buffer this object reuses from call to call.
  std::size_t reduce_shard(std::span<std::span<std::byte const> const> packets, std::size_t n, shard_key const& key,
                           float scale, std::span<std::byte> out, codec_context const& ctx,
                           std::vector<float>* received = nullptr) {
    std::span<float> sum;
    if constexpr (memory_type::on_host) {
      sum_.assign(n, 0.0f);
      sum = std::span<float>(sum_);
    } else {
      memory_type const mem = detail::memory_of(worker_codec_);
      if (!sum_) sum_.emplace(mem.make_buffer());
      sum_->resize(n * sizeof(float));
      sum = detail::float_span(*sum_, n);
      mem.zero(std::as_writable_bytes(sum));
    }
    for (auto const& p : packets) {
      if (!p.empty()) worker_codec_.decompress_add(p, sum, scale, ctx);
    }
    if (received != nullptr) {
      if constexpr (memory_type::on_host) {
        *received = sum_;
      } else {
        detail::memory_of(worker_codec_)
            .read(std::as_bytes(sum), [&](std::span<std::byte const> b) {
              received->resize(n);
              if (n != 0) std::memcpy(received->data(), b.data(), b.size());
            });
      }
    }
    // Shared support: select the workers' support (file comment), not a second sample.
    bool const shared = detail::aggregation_of_codec(server_codec_) == aggregation_kind::shared_support;
    two_way_side const stream = shared ? two_way_side::worker : two_way_side::server;
    tensor_view<float const> const v(std::span<float const>(sum), shard_stream_id(key, stream));
    return compress_with(sf_, server_codec_, server_states_, server_undo_, key, v, out, ctx);
  }

  /// The worker residual of `key` (empty until its first step; in the codec's memory space).
  [[nodiscard]] std::span<float const> worker_residual(shard_key const& key) const {
    auto it = worker_states_.find(key);
    return it == worker_states_.end() ? std::span<float const>{} : it->second.values();
  }
  /// The server residual of `key` (empty until its first step; in the codec's memory space).
  [[nodiscard]] std::span<float const> server_residual(shard_key const& key) const {
    auto it = server_states_.find(key);
    return it == server_states_.end() ? std::span<float const>{} : it->second.values();
  }
  /// Calls `f(key, state)` for the `side` feedback state of every shard of tensor `t` that
  /// this object holds (e.g. the learning-rate correction of compressed Adam,
  /// optim/compressed_adam.hpp, rescales residuals this way).
  template <class F>
  void for_each_state(two_way_side side, tensor_id t, F&& f) {
    auto visit = [&](auto& states, auto& log) {
      auto it = states.lower_bound(shard_key{t, 0, 0});
      for (; it != states.end() && it->first.tensor == t; ++it) {
        remember(states, log, it->first);
        f(std::as_const(it->first), it->second);
      }
    };
    if (side == two_way_side::worker) visit(worker_states_, worker_undo_);
    else visit(server_states_, server_undo_);
  }

  /// Forgets both sides' state.
  void reset() {
    worker_states_.clear();
    server_states_.clear();
    worker_undo_.clear();
    server_undo_.clear();
    depth_ = 0;
  }

  /// Opens a step (the collectives of this file do, for each call): until the matching
  /// `commit_step`, the first change to each shard's state (`compress_shard`, `reduce_shard`,
  /// `for_each_state`) keeps a copy of it, and `rollback_step` puts every such state back as it
  /// was (a shard that had none loses it again). Steps nest; the outermost commit keeps the
  /// changes. Cost: one copy of each state a step touches.
  void begin_step() noexcept { ++depth_; }
  /// Keeps the changes of the step (at the outermost level: forgets the copies).
  void commit_step() noexcept {
    if (depth_ > 0 && --depth_ == 0) {
      worker_undo_.clear();
      server_undo_.clear();
    }
  }
  /// Puts back every state changed since the outermost open step, and closes all steps.
  void rollback_step() {
    undo(worker_states_, worker_undo_);
    undo(server_states_, server_undo_);
    depth_ = 0;
  }

  /// Both sides' error-feedback state ("GCTW" version 1: the worker then the server records,
  /// each a count, then per shard its tensor id, shard, shard count and the state's values).
  /// With a device codec the values are copied to the host (after the work on its stream).
  [[nodiscard]] std::vector<std::byte> save() const {
    detail::byte_writer w;
    w.begin("GCTW", 1);
    auto put = [&](auto const& states) {
      w.put_u64(states.size());
      for (auto const& [key, st] : states) {
        w.put_u64(static_cast<std::uint64_t>(key.tensor));
        w.put_u64(key.shard);
        w.put_u64(key.shards);
        if constexpr (memory_type::on_host) {
          w.put_floats(st.values());
        } else {
          std::span<float const> const v = st.values();
          std::vector<float> host(v.size());
          if (!v.empty()) {
            detail::memory_of(worker_codec_).read(std::as_bytes(v), [&](std::span<std::byte const> b) {
              std::memcpy(host.data(), b.data(), b.size());
            });
          }
          w.put_floats(std::span<float const>(host));
        }
      }
    };
    put(worker_states_);
    put(server_states_);
    return w.finish();
  }
  /// Restores a state written by `save`; `format_error` on a malformed buffer, and the state
  /// is unchanged then. With a device codec the values are copied to the device (the
  /// feedback state's `assign(values, memory)`) on the codec's stream.
  void load(std::span<std::byte const> in) {
    detail::byte_reader r(in, "GCTW", 1, "two-way compressor state");
    memory_type const mem = detail::memory_of(worker_codec_);
    auto get = [&r, &mem](auto& states) {
      (void)mem;  // read by device states only
      std::uint64_t const n = r.get_u64();
      for (std::uint64_t i = 0; i < n; ++i) {
        shard_key key;
        key.tensor = static_cast<tensor_id>(r.get_u32_of_u64("tensor id"));
        key.shard = r.get_u32_of_u64("shard");
        key.shards = r.get_u32_of_u64("shard count");
        if (key.shards == 0 || key.shard >= key.shards) r.fail("a shard key is out of range");
        std::vector<float> const v = r.get_floats();
        if (states.count(key) != 0) r.fail("a shard appears twice");
        auto& st = states[key];
        if constexpr (requires { st.assign(std::span<float const>(v), mem); }) {
          st.assign(std::span<float const>(v), mem);
        } else {
          st.assign(std::span<float const>(v));
        }
      }
    };
    decltype(worker_states_) workers;
    decltype(server_states_) servers;
    get(workers);
    get(servers);
    r.expect_end();
    worker_states_ = std::move(workers);
    server_states_ = std::move(servers);
    worker_undo_.clear();
    server_undo_.clear();
    depth_ = 0;
  }

 private:
  template <class F, class States, class Log>
  std::size_t compress_with(F const& f, Codec const& c, States& states, Log& log, shard_key const& key,
                            tensor_view<float const> v, std::span<std::byte> out, codec_context const& ctx) {
    if (auto it = states.find(key); it != states.end()) {
      // The policy leaves the state unchanged when it throws, so the copy is taken up front.
      remember(states, log, key);
      return f.compress(c, it->second, v, out, ctx);
    }
    typename F::state fresh;  // enters the map only once a step has succeeded
    std::size_t const bytes = f.compress(c, fresh, v, out, ctx);
    remember(states, log, key);
    states.emplace(key, std::move(fresh));
    return bytes;
  }

  // Within a step, keeps the state of `key` as it was before its first change.
  template <class States, class Log>
  void remember(States const& states, Log& log, shard_key const& key) {
    if (depth_ == 0 || log.count(key) != 0) return;
    auto it = states.find(key);
    log.emplace(key, it == states.end() ? std::nullopt : std::optional(it->second));
  }
  template <class States, class Log>
  static void undo(States& states, Log& log) {
    for (auto& [key, before] : log) {
      if (before) states.insert_or_assign(key, std::move(*before));
      else states.erase(key);
    }
    log.clear();
  }

  Codec worker_codec_, server_codec_;
  WorkerFeedback wf_;
  ServerFeedback sf_;
  std::map<shard_key, typename WorkerFeedback::state> worker_states_;
  std::map<shard_key, typename ServerFeedback::state> server_states_;
  std::map<shard_key, std::optional<typename WorkerFeedback::state>> worker_undo_;
  std::map<shard_key, std::optional<typename ServerFeedback::state>> server_undo_;
  int depth_ = 0;
  // The server's sum: a float vector on the host; elsewhere a buffer of the codec's memory
  // space, made at the first `reduce_shard`.
  std::conditional_t<memory_type::on_host, std::vector<float>,
                     std::optional<typename memory_type::buffer>>
      sum_;
};

namespace detail {

template <class TwoWay>
std::uint64_t two_way_fingerprint(TwoWay const& tw, std::string_view what, tensor_id id, std::size_t n,
                                  std::size_t shards, std::size_t extra, reduction op, codec_context const& ctx) {
  fingerprint f;
  f.add(what).add(static_cast<std::uint64_t>(id)).add(n).add(shards).add(extra);
  f.add(codec_fingerprint(tw.worker_codec(), n, op, ctx, "worker"));
  f.add(codec_fingerprint(tw.server_codec(), n, op, ctx, "server"));
  return f.value();
}

/// One collective call's step of a two-way compressor: rolled back unless `commit` is called.
template <class TwoWay>
class two_way_step {
 public:
  explicit two_way_step(TwoWay& tw) noexcept : tw_(tw) { tw_.begin_step(); }
  two_way_step(two_way_step const&) = delete;
  two_way_step& operator=(two_way_step const&) = delete;
  ~two_way_step() {
    if (done_) return;
    try {
      tw_.rollback_step();
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while restoring; nothing better to do
    }
  }
  void commit() noexcept {
    tw_.commit_step();
    done_ = true;
  }

 private:
  TwoWay& tw_;
  bool done_ = false;
};

template <class Codec>
void check_two_way_codec(Codec const& c, char const* who) {
  if (aggregation_of_codec(c) == aggregation_kind::low_rank) {
    throw config_error(std::string("gradcomp: ") + who + " needs a codec whose packets can be decompressed "
                       "one by one; low-rank codecs use all_reduce_low_rank");
  }
}

}  // namespace detail

namespace detail {

/// `all_reduce_two_way` without its outcome round and its rollback: the two phases and the
/// final decoding (whose failure is recorded in `check`). The payload buffers (worker packets
/// sent and received, the server packet, the gathered server packets) are in the codecs'
/// memory space; the agreement rounds are host messages.
template <communicator Comm, class TwoWay>
collective_result two_way_exchange(Comm& comm, TwoWay& tw, tensor_view<float const> grad, std::span<float> out,
                                   codec_context const& ctx, collective_options const& opt, step_check& check) {
  using mem_type = typename TwoWay::memory_type;
  static_assert(std::same_as<memory_of_t<typename TwoWay::codec_type>, mem_type>);
  mem_type const mem = memory_of(tw.worker_codec());
  std::size_t const n = out.size();
  auto const w = static_cast<std::size_t>(comm.size());
  auto const me = static_cast<std::size_t>(comm.rank());
  std::size_t const tail = opt.checksum ? checksum_trailer_bytes : 0;
  std::uint64_t fp = 0;
  collective_result res;
  res.path = collective_path::two_way;

  // Phase 1: worker compression of every shard, sizes and agreement, all-to-all.
  std::vector<std::size_t> my_sizes(w, 0);
  typename mem_type::buffer send = mem.make_buffer();
  rank_report mine;
  mine.count = n;
  mine.codec = static_cast<std::uint32_t>(id_of_codec(tw.worker_codec()));
  std::exception_ptr local;
  try {
    fp = two_way_fingerprint(tw, "all_reduce_two_way", grad.id(), n, w, opt.checksum ? 1 : 0, opt.op, ctx);
    mine.fingerprint = fp;
    check_two_way_codec(tw.worker_codec(), "all_reduce_two_way");
    check_two_way_codec(tw.server_codec(), "all_reduce_two_way");
    if (!mem_type::on_host && opt.checksum) {
      throw config_error(
          std::string("gradcomp: all_reduce_two_way: codec '") +
          codec_name(id_of_codec(tw.worker_codec())) +
          "' keeps its packets in device memory; the checksum option reads every payload on the "
          "host and is available for host codecs only");
    }
    std::size_t cap = 0;
    for (std::size_t s = 0; s < w; ++s) {
      auto const [b, e] = shard_range(n, s, w);
      cap += tw.worker_codec().max_compressed_bytes(e - b) + tail;
    }
    send.resize(cap);
    std::size_t at = 0;
    for (std::size_t s = 0; s < w && !grad.empty(); ++s) {
      auto const [b, e] = shard_range(n, s, w);
      my_sizes[s] = tw.compress_shard(grad.span().subspan(b, e - b), shard_key{grad.id(), static_cast<std::uint32_t>(s),
                                      static_cast<std::uint32_t>(w)}, send.span().subspan(at), ctx);
      if constexpr (mem_type::on_host) {
        if (opt.checksum) my_sizes[s] = add_trailer(send.span().subspan(at), my_sizes[s]);
      }
      at += my_sizes[s];
    }
  } catch (...) {
    local = std::current_exception();
    mine.status = 1;
  }
  std::vector<std::uint64_t> extra(my_sizes.begin(), my_sizes.end());
  report_round round1;
  round1.post(comm, mine, extra, opt.checksum, "all_reduce_two_way (worker phase)");
  round1.finish("all_reduce_two_way (worker phase)", local);
  for (std::size_t s = 0; s < w; ++s) {
    auto const [b, e] = shard_range(n, s, w);
    round1.check_sizes("all_reduce_two_way (worker phase)", tw.worker_codec().max_compressed_bytes(e - b) + tail,
                       my_sizes[s], s);
  }
  std::vector<std::size_t> recv_counts(w);
  std::size_t recv_total = 0;
  for (std::size_t p = 0; p < w; ++p) {
    recv_counts[p] = static_cast<std::size_t>(round1.extra(p, me));
    recv_total += recv_counts[p];
  }
  std::size_t send_total = 0;
  for (std::size_t s = 0; s < w; ++s) {
    send_total += my_sizes[s];
    if (s != me) res.wire_bytes += my_sizes[s];
  }
  res.packet_bytes = send_total;
  typename mem_type::buffer recv = mem.make_buffer();
  recv.resize(recv_total);
  comm.all_to_all_v(std::as_const(send).span().first(send_total), std::span<std::size_t const>(my_sizes),
                    recv.span(), std::span<std::size_t const>(recv_counts));
  res.wire_bytes += round1.wire_bytes();

  // Phase 2: this rank serves shard `me`.
  auto const [mb, me_end] = shard_range(n, me, w);
  typename mem_type::buffer spkt = mem.make_buffer();
  std::size_t sbytes = 0;
  rank_report mine2;
  mine2.count = n;
  mine2.codec = static_cast<std::uint32_t>(id_of_codec(tw.server_codec()));
  mine2.fingerprint = fp;
  std::exception_ptr local2;
  try {
    std::vector<std::span<std::byte const>> packets(w);
    std::size_t at = 0;
    for (std::size_t p = 0; p < w; ++p) {
      packets[p] = std::as_const(recv).span().subspan(at, recv_counts[p]);
      at += recv_counts[p];
    }
    if constexpr (mem_type::on_host) {
      if (opt.checksum) {
        for (auto& pk : packets) pk = strip_trailer(pk, "all_reduce_two_way (server phase)");
      }
    }
    spkt.resize(tw.server_codec().max_compressed_bytes(me_end - mb) + tail);
    sbytes = tw.reduce_shard(
        packets, me_end - mb,
        shard_key{grad.id(), static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(w)},
        reduction_scale(opt.op, comm.size()), spkt.span(), ctx);
    if constexpr (mem_type::on_host) {
      if (opt.checksum) sbytes = add_trailer(spkt.span(), sbytes);
    }
    mine2.bytes = sbytes;
  } catch (...) {
    local2 = std::current_exception();
    mine2.status = 1;
  }
  report_round round2;
  round2.post(comm, mine2, {}, opt.checksum, "all_reduce_two_way (server phase)");
  round2.finish("all_reduce_two_way (server phase)", local2);
  round2.check_sizes("all_reduce_two_way (server phase)",
                     tw.server_codec().max_compressed_bytes(n / w + (n % w != 0 ? 1 : 0)) + tail, sbytes);
  std::vector<std::size_t> const sizes = round2.bytes();
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  typename mem_type::buffer all = mem.make_buffer();
  all.resize(total);
  comm.all_gather_v(std::as_const(spkt).span().first(sbytes), all.span(),
                    std::span<std::size_t const>(sizes));
  res.wire_bytes += round2.wire_bytes() + ring_all_gather_bytes(sizes, comm.rank());
  check.guard([&] {
    std::size_t at = 0;
    for (std::size_t s = 0; s < w; ++s) {
      auto const [b, e] = shard_range(n, s, w);
      std::span<std::byte const> pk = std::as_const(all).span().subspan(at, sizes[s]);
      if constexpr (mem_type::on_host) {
        if (opt.checksum) pk = strip_trailer(pk, "all_reduce_two_way");
      }
      tw.server_codec().decompress(pk, out.subspan(b, e - b), ctx);
      at += sizes[s];
    }
  });
  if constexpr (mem_type::on_host) {
    if (!check.failed()) check.output(out);
  }
  return res;
}

}  // namespace detail

/// Two-way compressed all-reduce of `grad` into `out` (see file comment). `grad` empty: this
/// rank contributes nothing (its worker residuals are untouched) but still serves its shard.
/// Collective: every rank passes the same codecs, size, tensor id (which keys the residuals of
/// the shards) and options.
template <communicator Comm, class TwoWay>
collective_result all_reduce_two_way(Comm& comm, TwoWay& tw, tensor_view<float const> grad, std::span<float> out,
                                     codec_context const& ctx = {}, collective_options const& opt = {}) {
  detail::check_contribution(grad.size(), out.size(), "all_reduce_two_way");
  detail::two_way_step<TwoWay> step(tw);
  detail::step_check check(opt.checksum);
  collective_result res = detail::two_way_exchange(comm, tw, grad, out, ctx, opt, check);
  detail::agree_outcome(comm, check, "all_reduce_two_way");
  res.wire_bytes += detail::outcome_wire_bytes(opt.checksum, comm.size());
  step.commit();
  return res;
}

/// `all_reduce_two_way` of a 16-bit gradient into a 16-bit output: the gradient is widened to
/// float32 (exact), both sides compress, sum and keep their residuals in float32 as in the
/// float32 overload, and the decoded result is rounded once into `out`; bit-identical to the
/// float32 overload on the widened gradient, rounded once.
template <communicator Comm, class TwoWay, element T>
  requires(!std::same_as<T, float>)
collective_result all_reduce_two_way(Comm& comm, TwoWay& tw, tensor_view<T const> grad, std::span<T> out,
                                     codec_context const& ctx = {}, collective_options const& opt = {}) {
  static_assert(
      TwoWay::memory_type::on_host,
      "all_reduce_two_way of a 16-bit gradient widens it on the host: pass a float32 device "
      "gradient to a device codec");
  return detail::through_f32(grad, out, ctx, "all_reduce_two_way",
                             [&](tensor_view<float const> g, std::span<float> o) {
                               return all_reduce_two_way(comm, tw, g, o, ctx, opt);
                             });
}

GRADCOMP_NAMESPACE_END
