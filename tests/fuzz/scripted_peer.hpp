// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// `scripted_peer`: a communicator of two ranks seen from rank 0, whose peer (rank 1) is a
/// script. Every byte rank 0 receives from rank 1 — agreement reports, packet sizes, packets,
/// value sections, factors, parameter-server replies — is read from a fuzz input, in the order
/// rank 0 posts its operations, so a target plays a malicious or broken peer against the real
/// collectives. When the script runs out the operation fails with `comm_error`, like a peer
/// that disconnected.
///
/// In *recording* mode (the corpus generator) it wraps one rank of a real two-rank in-process
/// world instead, and rank 0 records every byte it receives from rank 1: an honest exchange
/// that replays exactly as a script. Every operation is then built from the real all-gathers,
/// all-to-all and point-to-point messages, so that what rank 0 receives from rank 1 is always
/// rank 1's own contribution (an all-reduce gathers both buffers and reduces them locally).
///
/// Operations complete when posted (the returned request is complete, or fails on `wait`). The
/// argument checks are the library adapters' (`comm/detail/checks.hpp`); on top, the counts of
/// an all-gather-v must add up without wrapping around (a library that hands a transport
/// wrapped-around counts has a bug even if the transport's own sum matches).

#include "fuzz.hpp"

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/detail/checks.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gradcomp_fuzz {

class scripted_peer : public gradcomp::blocking_operations<scripted_peer> {
 public:
  using communicator_concept = gradcomp::communicator_tag;
  using request = gradcomp::request;
  using comm_type = gradcomp::comm_type;
  using reduce_op = gradcomp::reduce_op;

  /// Rank 0; the peer's bytes are read from `script`.
  explicit scripted_peer(input& script) : script_(&script) {}
  /// Recording mode: rank `real.rank()` of a real two-rank world; rank 0 appends what it
  /// receives from rank 1 to `record`.
  scripted_peer(gradcomp::in_process_communicator& real, std::vector<std::byte>& record)
      : real_(&real), record_(&record) {}

  [[nodiscard]] int rank() const { return real_ != nullptr ? real_->rank() : 0; }
  [[nodiscard]] int size() const { return 2; }

  request ibarrier() {
    if (real_ != nullptr) real_->barrier();
    return {};
  }
  request ibroadcast(std::span<std::byte> buf, int root) {
    gradcomp::detail::comm_checks::peer(root, 2, "broadcast root");
    if (real_ != nullptr) {
      real_->broadcast(buf, root);
      if (root != rank()) record(buf);
      return {};
    }
    return root == 0 ? request{} : receive(buf);
  }
  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    gradcomp::detail::comm_checks::reduction(buf.size(), t, op, "all_reduce");
    std::vector<std::byte> theirs(buf.size());
    if (real_ != nullptr) {
      std::vector<std::byte> both(2 * buf.size());
      real_->all_gather(buf, both);
      theirs.assign(both.begin() + static_cast<std::ptrdiff_t>(other() * buf.size()),
                    both.begin() + static_cast<std::ptrdiff_t>((other() + 1) * buf.size()));
      record(theirs);
    } else if (request r = receive(theirs); r.pending()) {
      return r;
    }
    gradcomp::reduce_into(t, op, buf.data(), theirs.data(), buf.size());
    return {};
  }
  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                          reduce_op op) {
    gradcomp::detail::comm_checks::reduce_scatter(in.size(), out.size(), t, op, 2);
    std::size_t const b = out.size();
    auto const mine = in.subspan(static_cast<std::size_t>(rank()) * b, b);
    std::copy(mine.begin(), mine.end(), out.begin());
    std::vector<std::byte> theirs(b);
    if (real_ != nullptr) {
      std::vector<std::byte> both(2 * in.size());
      real_->all_gather(in, both);
      auto const at =
          both.begin() +
          static_cast<std::ptrdiff_t>(other() * in.size() + static_cast<std::size_t>(rank()) * b);
      theirs.assign(at, at + static_cast<std::ptrdiff_t>(b));
      record(theirs);
    } else if (request r = receive(theirs); r.pending()) {
      return r;
    }
    gradcomp::reduce_into(t, op, out.data(), theirs.data(), b);
    return {};
  }
  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    gradcomp::detail::comm_checks::all_gather(in.size(), out.size(), 2);
    if (real_ != nullptr) {
      real_->all_gather(in, out);
      record(out.subspan(other() * in.size(), in.size()));
      return {};
    }
    std::copy(in.begin(), in.end(), out.begin());
    return receive(out.subspan(in.size()));
  }
  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                        std::span<std::size_t const> counts) {
    gradcomp::detail::comm_checks::all_gather_v(in.size(), out.size(), counts, rank(), 2);
    GRADCOMP_FUZZ_CHECK(counts[1] <= out.size() && counts[0] == out.size() - counts[1],
                        "all_gather_v counts that wrap around (a peer's size summed unchecked)");
    if (real_ != nullptr) {
      real_->all_gather_v(in, out, counts);
      record(out.subspan(other() == 0 ? 0 : counts[0], counts[other()]));
      return {};
    }
    std::copy(in.begin(), in.end(), out.begin());
    return receive(out.subspan(counts[0], counts[1]));
  }
  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> sc,
                        std::span<std::byte> out, std::span<std::size_t const> rc) {
    gradcomp::detail::comm_checks::all_to_all_v(in.size(), sc, out.size(), rc, 2);
    GRADCOMP_FUZZ_CHECK(sc[0] <= in.size() && rc[0] <= out.size(),
                        "all_to_all_v counts that wrap around");
    if (real_ != nullptr) {
      real_->all_to_all_v(in, sc, out, rc);
      record(out.subspan(other() == 0 ? 0 : rc[0], rc[other()]));
      return {};
    }
    if (sc[0] != rc[0]) {
      return failed("all_to_all_v: rank 0 sends itself " + std::to_string(sc[0]) +
                    " bytes but expects " + std::to_string(rc[0]));
    }
    std::copy(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(sc[0]), out.begin());
    return receive(out.subspan(rc[0]));
  }
  request isend(std::span<std::byte const> in, int peer, int tag) {
    check_p2p(peer, tag);
    if (real_ != nullptr) real_->send(in, peer, tag);  // in-process sends are eager
    return {};
  }
  request irecv(std::span<std::byte> buf, int peer, int tag) {
    check_p2p(peer, tag);
    if (real_ != nullptr) {
      real_->recv(buf, peer, tag);
      record(buf);
      return {};
    }
    return receive(buf);
  }

 private:
  struct failed_state final : request::state {
    explicit failed_state(std::string w) : what(std::move(w)) {}
    bool test() override { return true; }
    void wait() override { throw gradcomp::comm_error("gradcomp: scripted peer: " + what); }
    std::string what;
  };
  static request failed(std::string what) {
    return request(std::make_unique<failed_state>(std::move(what)));
  }

  [[nodiscard]] std::size_t other() const { return rank() == 0 ? 1 : 0; }

  void check_p2p(int peer, int tag) const {
    gradcomp::detail::comm_checks::peer(peer, 2, "peer");
    gradcomp::detail::comm_checks::tag(tag);
    if (peer == rank())
      throw gradcomp::config_error("gradcomp: scripted peer: a rank messages itself");
  }

  // Recording mode: rank 0 keeps what rank 1 sent it.
  void record(std::span<std::byte const> theirs) {
    if (rank() == 0) record_->insert(record_->end(), theirs.begin(), theirs.end());
  }

  // Script mode: the peer's next `into.size()` bytes.
  request receive(std::span<std::byte> into) {
    if (script_->left() < into.size()) {
      (void)script_->rest();
      return failed("the peer closed the connection");
    }
    auto const got = script_->take(into.size());
    std::copy(got.begin(), got.end(), into.begin());
    return {};
  }

  input* script_ = nullptr;
  gradcomp::in_process_communicator* real_ = nullptr;
  std::vector<std::byte>* record_ = nullptr;
};

}  // namespace gradcomp_fuzz
