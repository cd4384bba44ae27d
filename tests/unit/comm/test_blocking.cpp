// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// comm/blocking.hpp: blocking_operations writes every blocking operation once, as the
// non-blocking form with the same arguments followed by wait(). A recording communicator shows
// that each one reaches its non-blocking twin with its arguments, returns only once the request
// has completed, and throws what the request's wait() throws.

#include <gradcomp/comm/async_adaptor.hpp>
#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/core/error.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

using namespace gradcomp;

namespace {

// A request whose completion is visible: wait() sets *done (or throws, when told to).
class flag_state final : public request::state {
 public:
  flag_state(bool* done, bool fail) : done_(done), fail_(fail) {}
  bool test() override { return false; }
  void wait() override {
    if (fail_) throw comm_error("gradcomp test: the transport failed");
    *done_ = true;
  }

 private:
  bool* done_;
  bool fail_;
};

// Non-blocking operations only; the blocking ones come from blocking_operations. Each call
// records its name and arguments.
class recording_comm : public blocking_operations<recording_comm> {
 public:
  using communicator_concept = communicator_tag;

  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 2; }

  // "what type op" (built with append: GCC 12's -Warray-bounds misfires on chained operator+
  // of std::string at -O2)
  static std::string label(char const* what, comm_type t, reduce_op op) {
    std::string s(what);
    s.append(" ").append(comm_type_name(t)).append(" ").append(reduce_op_name(op));
    return s;
  }

  request ibarrier() { return note("barrier", 0, 0); }
  request ibroadcast(std::span<std::byte> buf, int root) {
    return note("broadcast", buf.size(), root);
  }
  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    return note(label("all_reduce", t, op), buf.size(), 0);
  }
  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                          reduce_op op) {
    return note(label("reduce_scatter", t, op), in.size(), static_cast<int>(out.size()));
  }
  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    return note("all_gather", in.size(), static_cast<int>(out.size()));
  }
  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                        std::span<std::size_t const> counts) {
    return note("all_gather_v " + std::to_string(counts.size()), in.size(),
                static_cast<int>(out.size()));
  }
  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    return note("all_to_all_v " + std::to_string(send_counts.size()) + " " +
                    std::to_string(recv_counts.size()),
                in.size(), static_cast<int>(out.size()));
  }
  request isend(std::span<std::byte const> in, int peer, int tag) {
    return note("send " + std::to_string(tag), in.size(), peer);
  }
  request irecv(std::span<std::byte> out, int peer, int tag) {
    return note("recv " + std::to_string(tag), out.size(), peer);
  }

  struct call {
    std::string what;
    std::size_t bytes;
    int arg;
  };
  std::vector<call> calls;
  bool fail = false;
  // One completion flag per call, at a stable address.
  std::vector<std::unique_ptr<bool>> done;

 private:
  request note(std::string what, std::size_t bytes, int arg) {
    calls.push_back({std::move(what), bytes, arg});
    done.push_back(std::make_unique<bool>(false));
    return request(std::make_unique<flag_state>(done.back().get(), fail));
  }
};

}  // namespace

static_assert(communicator<recording_comm>);
static_assert(communicator<in_process_communicator>);
static_assert(communicator<async_adaptor<in_process_communicator>>);
// The blocking operations come from the base, not from per-communicator copies.
static_assert(
    std::derived_from<in_process_communicator, blocking_operations<in_process_communicator>>);
static_assert(std::derived_from<async_adaptor<in_process_communicator>,
                                blocking_operations<async_adaptor<in_process_communicator>>>);

TEST_CASE("blocking_operations forwards each blocking call to its non-blocking form and waits",
          "[comm][blocking]") {
  recording_comm c;
  std::vector<std::byte> a(8), b(16);
  std::vector<std::size_t> const counts{4, 4}, counts3{1, 2, 3};
  c.barrier();
  c.broadcast(a, 1);
  c.all_reduce(a, comm_type::bf16, reduce_op::max);
  c.reduce_scatter(b, a, comm_type::f32, reduce_op::sum);
  c.all_gather(a, b);
  c.all_gather_v(a, b, counts);
  c.all_to_all_v(a, counts, b, counts3);
  c.send(a, 1, 5);
  c.recv(b, 1, 6);

  std::vector<std::string> const what{
      "barrier",    "broadcast",      "all_reduce bf16 max", "reduce_scatter f32 sum",
      "all_gather", "all_gather_v 2", "all_to_all_v 2 3",    "send 5",
      "recv 6"};
  std::vector<std::size_t> const bytes{0, 8, 8, 16, 8, 8, 8, 8, 16};
  std::vector<int> const arg{0, 1, 0, 8, 16, 16, 16, 1, 1};
  REQUIRE(c.calls.size() == what.size());
  for (std::size_t i = 0; i < what.size(); ++i) {
    INFO("call " << i);
    CHECK(c.calls[i].what == what[i]);
    CHECK(c.calls[i].bytes == bytes[i]);
    CHECK(c.calls[i].arg == arg[i]);
    CHECK(*c.done[i]);  // the request was waited for before the call returned
  }
}

TEST_CASE("blocking_operations throws what the request's wait() throws", "[comm][blocking]") {
  recording_comm c;
  c.fail = true;
  std::vector<std::byte> a(4);
  CHECK_THROWS_AS(c.all_reduce(a, comm_type::f32, reduce_op::sum), comm_error);
  CHECK_THROWS_AS(c.barrier(), comm_error);
  CHECK_THROWS_AS(c.recv(a, 1, 0), comm_error);
  REQUIRE(c.calls.size() == 3);
}
