// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test doubles for the collective tests: a shared-support codec (the shape random-k will have:
// a header, a check word derived from the shared seed, values at a support every rank
// computes alike), a rank-1 power-iteration low-rank session, a communicator that fails on
// a chosen operation, and gradient generators.

#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/sections.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/concepts/low_rank_session.hpp>
#include <gradcomp/gradcomp.hpp>

#include "../support/codec_support.hpp"
#include "../support/rank_check.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp_test {

/// Shared-support test double: keeps k = ceil(n / stride) coordinates, one per block of
/// `stride`, at an offset drawn from (seed, step, tensor id). Payload: u32 check word, then
/// the k values (f32). Summable at payload offset 4 (declared by `value_section`).
class shared_stride_codec {
 public:
  using codec_concept = gc::codec_tag;
  static constexpr gc::codec_id id = static_cast<gc::codec_id>(250);
  static constexpr gc::aggregation_kind aggregation = gc::aggregation_kind::shared_support;
  static constexpr bool unbiased = false;

  explicit shared_stride_codec(std::uint32_t stride = 10) : stride_(stride) {}

  [[nodiscard]] std::size_t max_compressed_bytes(std::size_t n) const { return gc::header_bytes + 4 + 4 * k_of(n); }
  [[nodiscard]] double bits_per_element() const { return 32.0 / stride_; }

  template <gc::element T>
  std::size_t compress(gc::tensor_view<T const> in, std::span<std::byte> out, gc::codec_context const& ctx = {}) const {
    std::size_t const n = in.size(), k = k_of(n);
    std::size_t const total = max_compressed_bytes(n);
    if (out.size() < total) throw gc::config_error("shared_stride_codec: output too small");
    gc::packet_header h{id, gc::dtype_of<T>, 0, n, 4 + 4 * k, stride_, static_cast<std::uint32_t>(in.id())};
    gc::write_header(out, h);
    std::uint32_t const off = offset(ctx, static_cast<std::uint32_t>(in.id()));
    gc::detail::store_le<std::uint32_t>(out.data() + gc::header_bytes, check(ctx, static_cast<std::uint32_t>(in.id())));
    for (std::size_t j = 0; j < k; ++j) {
      std::size_t const i = std::min(n - 1, j * stride_ + off % std::min<std::size_t>(stride_, n));
      gc::detail::store_f32(out.data() + gc::header_bytes + 4 + 4 * j, gc::to_float(in[i]));
    }
    return total;
  }
  template <gc::element T>
  void decompress(std::span<std::byte const> p, std::span<T> out, gc::codec_context const& ctx = {}) const {
    for (T& v : out) v = gc::from_float<T>(0.0f);
    decompress_add(p, out, 1.0f, ctx);
  }
  template <gc::element T>
  void decompress_add(std::span<std::byte const> p, std::span<T> out, float alpha = 1.0f,
                      gc::codec_context const& ctx = {}) const {
    gc::packet_header const h = gc::read_header(p);
    if (h.codec != id || h.count != out.size() || h.param0 != stride_) throw gc::format_error("shared_stride_codec: bad packet");
    std::size_t const n = out.size(), k = k_of(n);
    if (h.payload_bytes != 4 + 4 * k) throw gc::format_error("shared_stride_codec: bad size");
    if (gc::detail::load_le<std::uint32_t>(p.data() + gc::header_bytes) != check(ctx, h.param1)) {
      throw gc::format_error("shared_stride_codec: check word (decode with the sender's seed and step)");
    }
    std::uint32_t const off = offset(ctx, h.param1);
    for (std::size_t j = 0; j < k; ++j) {
      std::size_t const i = std::min(n - 1, j * stride_ + off % std::min<std::size_t>(stride_, n));
      float const v = gc::detail::load_f32(p.data() + gc::header_bytes + 4 + 4 * j);
      out[i] = gc::from_float<T>(std::fma(alpha, v, gc::to_float(out[i])));
    }
  }
  [[nodiscard]] gc::value_section value_section(std::span<std::byte const> p) const {
    gc::packet_header const h = gc::read_header(p);
    return {gc::header_bytes + 4, static_cast<std::size_t>(h.payload_bytes) - 4, gc::dtype::f32};
  }

 private:
  [[nodiscard]] std::size_t k_of(std::size_t n) const { return (n + stride_ - 1) / stride_; }
  static std::uint32_t offset(gc::codec_context const& ctx, std::uint32_t tid) {
    return static_cast<std::uint32_t>(test_rng(ctx.seed * 1000003u + ctx.step * 7919u + tid).next());
  }
  static std::uint32_t check(gc::codec_context const& ctx, std::uint32_t tid) {
    return static_cast<std::uint32_t>(test_rng(ctx.seed ^ (std::uint64_t{ctx.step} << 32) ^ (tid * 31u) ^ 0xC0FFEEu).next() >> 7);
  }
  std::uint32_t stride_;
};
static_assert(gc::codec<shared_stride_codec>);

/// Rank-1 power-iteration session over an n = rows x cols matrix (row-major): P = M q,
/// all-reduce P, p = P / |P|, Q = M^T p, all-reduce Q, result = alpha p Q^T. q starts at ones
/// and is warm-started with the summed Q. No error feedback (the real PowerSGD has it).
class rank1_session {
 public:
  using low_rank_session_concept = gc::low_rank_session_tag;
  explicit rank1_session(std::size_t rows) : rows_(rows) {}

  [[nodiscard]] std::uint64_t shape_fingerprint(std::size_t n) const { return rows_ * 1000003u + n; }
  void begin(gc::tensor_view<float const> g, std::size_t n, gc::codec_context const&) {
    if (rows_ == 0 || n % rows_ != 0) throw gc::config_error("rank1_session: n is not a multiple of rows");
    cols_ = n / rows_;
    m_.assign(g.span().begin(), g.span().end());
    if (m_.empty()) m_.assign(n, 0.0f);
    if (q_.size() != cols_) q_.assign(cols_, 1.0f);
  }
  [[nodiscard]] std::size_t factor_count() const { return 2; }
  std::span<float> factor(std::size_t i, gc::codec_context const&) {
    if (i == 0) {
      p_.assign(rows_, 0.0f);
      for (std::size_t r = 0; r < rows_; ++r)
        for (std::size_t c = 0; c < cols_; ++c) p_[r] += m_[r * cols_ + c] * q_[c];
      return p_;
    }
    normalize(p_);
    q_.assign(cols_, 0.0f);
    for (std::size_t r = 0; r < rows_; ++r)
      for (std::size_t c = 0; c < cols_; ++c) q_[c] += m_[r * cols_ + c] * p_[r];
    return q_;
  }
  void finish(std::span<float> out, float alpha, gc::codec_context const&) {
    for (std::size_t r = 0; r < rows_; ++r)
      for (std::size_t c = 0; c < cols_; ++c) out[r * cols_ + c] = alpha * (p_[r] * q_[c]);
  }
  static void normalize(std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double{x} * x;
    float const inv = s > 0 ? static_cast<float>(1.0 / std::sqrt(s)) : 0.0f;
    for (float& x : v) x *= inv;
  }

 private:
  std::size_t rows_, cols_ = 0;
  std::vector<float> m_, p_, q_;
};
static_assert(gc::low_rank_session<rank1_session>);

/// Wraps an in-process communicator; the `fail_at`-th blocking or non-blocking operation
/// (counting from 0) throws `std::runtime_error` instead of communicating (a rank that dies
/// mid-collective). `forge`, when set, rewrites a copy of what this rank contributes to every
/// all-gather and point-to-point send (a rank that lies in its messages).
class faulty_communicator {
 public:
  using communicator_concept = gc::communicator_tag;
  using forger = std::function<void(std::vector<std::byte>&)>;
  faulty_communicator(gc::in_process_communicator c, int fail_at, forger forge = {})
      : c_(c), fail_at_(fail_at), forge_(std::move(forge)) {}
  [[nodiscard]] int rank() const { return c_.rank(); }
  [[nodiscard]] int size() const { return c_.size(); }
  void barrier() { tick(); c_.barrier(); }
  void broadcast(std::span<std::byte> b, int root) { tick(); c_.broadcast(b, root); }
  void all_reduce(std::span<std::byte> b, gc::comm_type t, gc::reduce_op op) { tick(); c_.all_reduce(b, t, op); }
  void reduce_scatter(std::span<std::byte const> i, std::span<std::byte> o, gc::comm_type t, gc::reduce_op op) { tick(); c_.reduce_scatter(i, o, t, op); }
  void all_gather(std::span<std::byte const> i, std::span<std::byte> o) { tick(); c_.all_gather(forged(i), o); }
  void all_gather_v(std::span<std::byte const> i, std::span<std::byte> o, std::span<std::size_t const> c) { tick(); c_.all_gather_v(i, o, c); }
  void all_to_all_v(std::span<std::byte const> i, std::span<std::size_t const> sc, std::span<std::byte> o, std::span<std::size_t const> rc) { tick(); c_.all_to_all_v(i, sc, o, rc); }
  void send(std::span<std::byte const> i, int p, int t) { tick(); c_.send(forged(i), p, t); }
  void recv(std::span<std::byte> o, int p, int t) { tick(); c_.recv(o, p, t); }
  gc::request ibroadcast(std::span<std::byte> b, int root) { tick(); return c_.ibroadcast(b, root); }
  gc::request iall_reduce(std::span<std::byte> b, gc::comm_type t, gc::reduce_op op) { tick(); return c_.iall_reduce(b, t, op); }
  gc::request ireduce_scatter(std::span<std::byte const> i, std::span<std::byte> o, gc::comm_type t, gc::reduce_op op) { tick(); return c_.ireduce_scatter(i, o, t, op); }
  gc::request iall_gather(std::span<std::byte const> i, std::span<std::byte> o) { tick(); return c_.iall_gather(forged(i), o); }
  gc::request iall_gather_v(std::span<std::byte const> i, std::span<std::byte> o, std::span<std::size_t const> c) { tick(); return c_.iall_gather_v(i, o, c); }
  gc::request iall_to_all_v(std::span<std::byte const> i, std::span<std::size_t const> sc, std::span<std::byte> o, std::span<std::size_t const> rc) { tick(); return c_.iall_to_all_v(i, sc, o, rc); }
  gc::request isend(std::span<std::byte const> i, int p, int t) { tick(); return c_.isend(forged(i), p, t); }
  gc::request irecv(std::span<std::byte> o, int p, int t) { tick(); return c_.irecv(o, p, t); }

 private:
  void tick() {
    if (count_++ == fail_at_) throw std::runtime_error("injected failure of rank " + std::to_string(rank()));
  }
  // The message as sent: `in`, or a forged copy (in-process operations copy what they send
  // when posted, so the copy need not outlive the call).
  std::span<std::byte const> forged(std::span<std::byte const> in) {
    if (!forge_) return in;
    copy_.assign(in.begin(), in.end());
    forge_(copy_);
    return copy_;
  }
  gc::in_process_communicator c_;
  int fail_at_;
  forger forge_;
  std::vector<std::byte> copy_;
  int count_ = 0;
};
static_assert(gc::communicator<faulty_communicator>);

/// Gradient of rank r at step s (deterministic; heavy-tailed like real gradients).
inline std::vector<float> rank_gradient(std::size_t n, int rank, int step, std::uint64_t salt = 0) {
  return heavy_tailed(n, 1000003u * static_cast<std::uint64_t>(rank + 1) + 7919u * static_cast<std::uint64_t>(step) + salt);
}

/// max_i |a_i - b_i| / (tol_abs + tol_rel * scale_i) <= 1 ?
inline bool close(std::span<float const> a, std::span<float const> b, std::span<float const> scale, double rel,
                  double abs = 1e-30) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(double{a[i]} - b[i]) <= abs + rel * scale[i])) return false;
  }
  return true;
}

}  // namespace gradcomp_test
