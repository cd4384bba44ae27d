// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The MPI adapter: `mpi_communicator` models `communicator` over an `MPI_Comm`, and
/// `mpi_environment` initializes and finalizes MPI for programs that want gradcomp to do it.
/// Needs `<mpi.h>`: link the CMake target `gradcomp::mpi` (created when `find_package(MPI)`
/// finds an implementation). Not included by `gradcomp/gradcomp.hpp`.
///
/// Operations map to MPI's non-blocking calls (MPI-3): `MPI_Iallreduce`,
/// `MPI_Ireduce_scatter_block`, `MPI_Iallgather`, `MPI_Iallgatherv`, `MPI_Ialltoallv`,
/// `MPI_Ibcast`, `MPI_Ibarrier`, `MPI_Isend` / `MPI_Irecv`; the blocking forms post the
/// non-blocking call and wait for it, so the timeout applies to both.
///
/// Types: `comm_type`s map to `MPI_UINT8_T`, `MPI_INT32_T`, `MPI_UINT32_T`, `MPI_INT64_T`,
/// `MPI_UINT64_T`, `MPI_FLOAT`, `MPI_DOUBLE` with `MPI_SUM` / `MPI_MAX` / `MPI_MIN` (NaN
/// handling of max/min is then MPI's). MPI has no 16-bit floats: `f16` and `bf16` are 2-byte
/// contiguous `MPI_BYTE` datatypes with user-defined operations that call `reduce_into`
/// (comm/reduce.hpp), the reduction the in-process communicator uses: float32 arithmetic,
/// rounded to nearest even after each combination, the sum on SIMD kernels. They are created
/// on first use and freed when MPI is finalized (an attribute on `MPI_COMM_SELF`).
///
/// Large counts: MPI counts are `int`. `all_reduce`, `broadcast`, `send` and `recv` split
/// buffers into chunks of at most `mpi_options::max_chunk_bytes` (default and upper limit
/// `INT_MAX` bytes), posted together under one request. `reduce_scatter`, `all_gather`,
/// `all_gather_v` and `all_to_all_v` are not chunked: a count or a displacement above
/// `INT_MAX` bytes is rejected with `config_error` before anything is posted.
///
/// Failures (docs/collectives.md, "Communicators", has the details and what was measured):
/// - the communicator is duplicated (`MPI_Comm_dup`, unless `mpi_options::duplicate` is off)
///   and given `MPI_ERRORS_RETURN`, so an MPI error becomes a `comm_error` carrying
///   `MPI_Error_string`'s text instead of aborting the job;
/// - `wait()` polls `MPI_Testall` and gives up after `mpi_options::timeout` with a
///   `comm_error`: a peer that never takes part (hung, or gone while the MPI runtime carries on)
///   is reported, not waited for forever. A timed-out receive is cancelled; a timed-out
///   collective or send cannot be withdrawn from MPI, so its buffers may still be read or written
///   later: after any `comm_error` the communicator is broken and every later operation fails
///   at once. Recover by discarding it (or aborting the job), not by retrying;
/// - a receive whose message is shorter than the buffer is a `comm_error` (MPI itself reports a
///   longer one as truncation);
/// - what it cannot see: a peer process that dies is normally handled by the MPI runtime, and
///   Open MPI's `mpirun` then terminates the whole job (every rank, including the one waiting)
///   before the timeout; collectives called with mismatched arguments are erroneous MPI programs
///   whose outcome is MPI's (wrong data, an MPI error, or a timeout).
///
/// Threads: with `MPI_THREAD_MULTIPLE` any thread may post and wait. With
/// `MPI_THREAD_SERIALIZED` the program must keep calls to the communicator and to requests'
/// `wait()` / `test()` (which call `MPI_Testall`) from overlapping in time.

#include <gradcomp/comm/blocking.hpp>
#include <gradcomp/comm/detail/checks.hpp>
#include <gradcomp/comm/reduce.hpp>
#include <gradcomp/concepts/communicator.hpp>
#include <gradcomp/concepts/request.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// Options of an `mpi_communicator`.
struct mpi_options {
  /// How long `wait()` (and every blocking operation) waits for an operation before it throws
  /// `comm_error` and breaks the communicator.
  std::chrono::milliseconds timeout{std::chrono::minutes(2)};
  /// Largest number of bytes given to one MPI call by the chunked operations (`all_reduce`,
  /// `broadcast`, `send`, `recv`); values above `INT_MAX` mean `INT_MAX`. Smaller values are
  /// mostly useful to test chunking.
  std::size_t max_chunk_bytes = static_cast<std::size_t>(INT_MAX);
  /// Work on a duplicate of the given communicator (collective: every rank constructs its
  /// `mpi_communicator` together), so that gradcomp's error handler and messages stay apart from
  /// the application's. If false, the given communicator's error handler is set to
  /// `MPI_ERRORS_RETURN` and it is used as it is.
  bool duplicate = true;
};

namespace detail::mpi {

// Text of an MPI error code.
inline std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

// Throws comm_error for a failed MPI call that is not tied to a communicator.
inline void check(int rc, char const* what) {
  if (rc != MPI_SUCCESS)
    throw comm_error(std::string("gradcomp: ") + what + " failed: " + error_text(rc));
}

// The user-defined operation for the 16-bit floats: `reduce_into`, the host reduction that the
// in-process communicator uses too (its sum runs on the SIMD conversion kernels).
template <comm_type T, reduce_op O>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  // Called by MPI (C code): must not throw, and cannot for these arguments.
  try {
    reduce_into(T, O, static_cast<std::byte*>(inout), static_cast<std::byte const*>(in),
                static_cast<std::size_t>(*len) * comm_type_size(T));
  } catch (...) {
    std::terminate();
  }
}

// The user-defined datatypes and operations for the 16-bit floats. Created on first use; freed
// by the delete callback of an attribute on MPI_COMM_SELF, which MPI_Finalize runs first.
struct custom_types {
  std::mutex mutex;
  bool ready = false;
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Op ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                      {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
};

inline custom_types& custom() {
  static custom_types c;
  return c;
}

inline int free_custom(MPI_Comm, int keyval, void*, void*) {
  custom_types& c = custom();
  std::lock_guard lock(c.mutex);
  for (auto& row : c.ops) {
    for (MPI_Op& op : row) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }
  if (c.f16 != MPI_DATATYPE_NULL) MPI_Type_free(&c.f16);
  if (c.bf16 != MPI_DATATYPE_NULL) MPI_Type_free(&c.bf16);
  c.ready = false;
  MPI_Comm_free_keyval(&keyval);
  return MPI_SUCCESS;
}

inline void create_custom(custom_types& c) {
  check(MPI_Type_contiguous(2, MPI_BYTE, &c.f16), "MPI_Type_contiguous (f16)");
  check(MPI_Type_commit(&c.f16), "MPI_Type_commit (f16)");
  check(MPI_Type_contiguous(2, MPI_BYTE, &c.bf16), "MPI_Type_contiguous (bf16)");
  check(MPI_Type_commit(&c.bf16), "MPI_Type_commit (bf16)");
  check(MPI_Op_create(&user_reduce<comm_type::f16, reduce_op::sum>, 1, &c.ops[0][0]),
        "MPI_Op_create");
  check(MPI_Op_create(&user_reduce<comm_type::f16, reduce_op::max>, 1, &c.ops[0][1]),
        "MPI_Op_create");
  check(MPI_Op_create(&user_reduce<comm_type::f16, reduce_op::min>, 1, &c.ops[0][2]),
        "MPI_Op_create");
  check(MPI_Op_create(&user_reduce<comm_type::bf16, reduce_op::sum>, 1, &c.ops[1][0]),
        "MPI_Op_create");
  check(MPI_Op_create(&user_reduce<comm_type::bf16, reduce_op::max>, 1, &c.ops[1][1]),
        "MPI_Op_create");
  check(MPI_Op_create(&user_reduce<comm_type::bf16, reduce_op::min>, 1, &c.ops[1][2]),
        "MPI_Op_create");
  int keyval = MPI_KEYVAL_INVALID;
  check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_custom, &keyval, nullptr),
        "MPI_Comm_create_keyval");
  check(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr), "MPI_Comm_set_attr");
}

inline std::size_t op_index(reduce_op op) {
  return op == reduce_op::sum ? 0 : op == reduce_op::max ? 1 : 2;
}

// The MPI datatype and operation of a reduction.
inline std::pair<MPI_Datatype, MPI_Op> datatype_and_op(comm_type t, reduce_op op) {
  if (t == comm_type::f16 || t == comm_type::bf16) {
    custom_types& c = custom();
    std::lock_guard lock(c.mutex);
    if (!c.ready) {
      create_custom(c);
      c.ready = true;
    }
    std::size_t const row = t == comm_type::f16 ? 0 : 1;
    return {t == comm_type::f16 ? c.f16 : c.bf16, c.ops[row][op_index(op)]};
  }
  MPI_Op const mop = op == reduce_op::sum ? MPI_SUM : op == reduce_op::max ? MPI_MAX : MPI_MIN;
  switch (t) {
    case comm_type::u8: return {MPI_UINT8_T, mop};
    case comm_type::i32: return {MPI_INT32_T, mop};
    case comm_type::u32: return {MPI_UINT32_T, mop};
    case comm_type::i64: return {MPI_INT64_T, mop};
    case comm_type::u64: return {MPI_UINT64_T, mop};
    case comm_type::f32: return {MPI_FLOAT, mop};
    case comm_type::f64: return {MPI_DOUBLE, mop};
    default: break;
  }
  throw config_error("gradcomp: unknown comm_type " + std::to_string(static_cast<unsigned>(t)));
}

// A non-null pointer for empty buffers (some MPI argument checks reject null even for count 0).
inline std::byte* nonnull(std::byte* p) {
  static std::byte dummy{};
  return p != nullptr ? p : &dummy;
}
inline void* nonnull(std::byte const* p) { return nonnull(const_cast<std::byte*>(p)); }

inline int to_int(std::size_t n, char const* what) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    throw config_error(std::string("gradcomp: MPI ") + what + " of " + std::to_string(n) +
                       " bytes exceeds INT_MAX; this operation is not chunked (see comm/mpi.hpp)");
  }
  return static_cast<int>(n);
}

// What the communicator and its requests share.
struct comm_state {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  int rank = 0;
  int size = 1;
  int tag_ub = 32767;
  mpi_options options;
  std::atomic<bool> broken{false};
  std::mutex mutex;
  std::string why;

  comm_state() = default;
  comm_state(comm_state const&) = delete;
  comm_state& operator=(comm_state const&) = delete;

  ~comm_state() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A broken communicator may still have operations in flight that can never complete;
    // freeing it could then block, so it is left to MPI_Finalize.
    if (owned && finalized == 0 && !broken.load()) MPI_Comm_free(&comm);
  }

  [[noreturn]] void fail(std::string what) {
    {
      std::lock_guard lock(mutex);
      if (why.empty()) why = what;
    }
    broken = true;
    throw comm_error("gradcomp: MPI rank " + std::to_string(rank) + ": " + what);
  }

  void check_usable() {
    if (!broken.load()) return;
    std::lock_guard lock(mutex);
    throw comm_error("gradcomp: MPI rank " + std::to_string(rank) +
                     ": the communicator is unusable after an earlier failure (" + why + ")");
  }

  void check(int rc, std::string const& what) {
    if (rc != MPI_SUCCESS) fail(what + " failed: " + error_text(rc));
  }
};

// One posted operation: one or more MPI requests (chunks), the arrays MPI reads until they
// complete, and for receives the byte count each chunk must deliver.
class pending_op final : public request::state {
 public:
  pending_op(std::shared_ptr<comm_state> s, std::string what)
      : s_(std::move(s)), what_(std::move(what)) {}

  std::vector<MPI_Request> requests;
  std::vector<int> ints;          // counts and displacements of the v-operations
  std::vector<int> expect_bytes;  // receives: bytes each request must deliver
  bool is_recv = false;

  bool test() override {
    if (done_) return true;
    int flag = 0;
    poll(flag);
    return flag != 0;
  }

  void wait() override {
    if (done_) {
      finish();
      return;
    }
    auto const deadline = std::chrono::steady_clock::now() + s_->options.timeout;
    int spins = 0;
    while (true) {
      int flag = 0;
      poll(flag);
      if (flag != 0) break;
      if (std::chrono::steady_clock::now() >= deadline) timed_out();
      // Spin briefly for short operations, then back off so a long wait does not burn a core.
      if (++spins < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 20000 ? 20 : 500));
      }
    }
    finish();
  }

 private:
  void poll(int& flag) {
    if (requests.empty()) {
      flag = 1;
      done_ = true;
      return;
    }
    statuses_.resize(requests.size());
    int const rc =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, statuses_.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (MPI_Status const& st : statuses_) {
        if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) {
          error_ = what_ + ": " + error_text(st.MPI_ERROR);
          break;
        }
      }
      if (error_.empty()) error_ = what_ + ": " + error_text(rc);
      flag = 1;
    } else if (rc != MPI_SUCCESS) {
      error_ = what_ + ": " + error_text(rc);
      flag = 1;
    } else if (flag != 0 && is_recv) {
      for (std::size_t i = 0; i < requests.size() && error_.empty(); ++i) {
        int got = 0;
        MPI_Get_count(&statuses_[i], MPI_BYTE, &got);
        if (got != expect_bytes[i]) {
          error_ = what_ + ": the message holds " + std::to_string(got) + " bytes, " +
                   std::to_string(expect_bytes[i]) + " expected";
        }
      }
    }
    if (flag != 0) done_ = true;
  }

  void finish() {
    if (!error_.empty()) {
      std::string e = std::move(error_);
      error_.clear();
      s_->fail(e);
    }
  }

  [[noreturn]] void timed_out() {
    if (is_recv) {
      // An unmatched receive can be withdrawn, so its buffer is free again.
      for (MPI_Request& r : requests) {
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      }
      auto const limit = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      int flag = 0;
      while (flag == 0 && std::chrono::steady_clock::now() < limit) {
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
      }
    }
    done_ = true;
    s_->fail(what_ + ": timed out after " + std::to_string(s_->options.timeout.count()) +
             " ms (a peer did not take part)");
  }

  std::shared_ptr<comm_state> s_;
  std::string what_;
  std::vector<MPI_Status> statuses_;
  std::string error_;
  bool done_ = false;
};

}  // namespace detail::mpi

/// Threading level asked of `MPI_Init_thread` by `mpi_environment`.
enum class mpi_threading : std::uint8_t {
  serialized,  ///< `MPI_THREAD_SERIALIZED`: one thread at a time calls MPI
  multiple,    ///< `MPI_THREAD_MULTIPLE`: any thread at any time
};

/// Initializes MPI (unless it already is) and finalizes it on destruction if it initialized it.
/// One per program, created before any `mpi_communicator` and destroyed after the last one.
class mpi_environment {
 public:
  /// Initializes MPI without command-line arguments.
  explicit mpi_environment(mpi_threading level = mpi_threading::multiple)
      : mpi_environment(nullptr, nullptr, level) {}

  /// Initializes MPI with the program's arguments (MPI may remove its own from them). Throws
  /// `comm_error` if MPI cannot be initialized, or provides less than `MPI_THREAD_SERIALIZED`.
  mpi_environment(int* argc, char*** argv, mpi_threading level = mpi_threading::multiple) {
    int initialized = 0;
    detail::mpi::check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized != 0) {
      detail::mpi::check(MPI_Query_thread(&provided_), "MPI_Query_thread");
      return;
    }
    int const required =
        level == mpi_threading::multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
    detail::mpi::check(MPI_Init_thread(argc, argv, required, &provided_), "MPI_Init_thread");
    owns_ = true;
    if (provided_ < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      owns_ = false;
      throw comm_error("gradcomp: MPI provides thread level " + std::to_string(provided_) +
                       ", gradcomp needs at least MPI_THREAD_SERIALIZED");
    }
  }

  mpi_environment(mpi_environment const&) = delete;
  mpi_environment& operator=(mpi_environment const&) = delete;

  ~mpi_environment() {
    if (!owns_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Finalize();
  }

  /// True if this object initialized MPI (and will finalize it).
  [[nodiscard]] bool owns() const noexcept { return owns_; }
  /// The thread level MPI provides (`MPI_THREAD_*`).
  [[nodiscard]] int provided() const noexcept { return provided_; }
  /// True if any thread may call MPI at any time.
  [[nodiscard]] bool thread_multiple() const noexcept { return provided_ >= MPI_THREAD_MULTIPLE; }

 private:
  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

/// A `communicator` over an MPI communicator (see the file comment). Copies share the same
/// underlying communicator; the duplicate it made is freed with the last copy.
class mpi_communicator : public blocking_operations<mpi_communicator> {
 public:
  using communicator_concept = communicator_tag;

  /// Wraps `comm`. With `options.duplicate` (the default) this is collective over `comm`.
  /// MPI must be initialized.
  explicit mpi_communicator(MPI_Comm comm, mpi_options options = {})
      : s_(std::make_shared<detail::mpi::comm_state>()) {
    using detail::mpi::check;
    if (options.timeout.count() <= 0)
      throw config_error("gradcomp: the MPI timeout must be positive");
    if (options.max_chunk_bytes == 0)
      throw config_error("gradcomp: mpi_options::max_chunk_bytes must be positive");
    options.max_chunk_bytes = std::min(options.max_chunk_bytes, static_cast<std::size_t>(INT_MAX));
    s_->options = options;
    if (options.duplicate) {
      check(MPI_Comm_dup(comm, &s_->comm), "MPI_Comm_dup");
      s_->owned = true;
    } else {
      s_->comm = comm;
    }
    check(MPI_Comm_set_errhandler(s_->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(s_->comm, &s_->rank), "MPI_Comm_rank");
    check(MPI_Comm_size(s_->comm, &s_->size), "MPI_Comm_size");
    void* ub = nullptr;
    int has = 0;
    check(MPI_Comm_get_attr(s_->comm, MPI_TAG_UB, &ub, &has), "MPI_Comm_get_attr(MPI_TAG_UB)");
    if (has != 0 && ub != nullptr) s_->tag_ub = *static_cast<int*>(ub);
  }

  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  [[nodiscard]] int size() const noexcept { return s_->size; }
  /// The MPI communicator operations run on (the duplicate, by default).
  [[nodiscard]] MPI_Comm native() const noexcept { return s_->comm; }
  [[nodiscard]] mpi_options const& options() const noexcept { return s_->options; }
  /// True once a `comm_error` has made the communicator unusable.
  [[nodiscard]] bool broken() const noexcept { return s_->broken.load(); }

  request ibarrier() {
    auto op = start("barrier");
    op->requests.emplace_back();
    s_->check(MPI_Ibarrier(s_->comm, &op->requests.back()), "MPI_Ibarrier");
    return request(std::move(op));
  }

  request ibroadcast(std::span<std::byte> buf, int root) {
    detail::comm_checks::peer(root, size(), "broadcast root");
    auto op = start("broadcast of " + std::to_string(buf.size()) + " bytes from rank " +
                    std::to_string(root));
    for_chunks(buf.size(), 1, [&](std::size_t at, std::size_t n) {
      op->requests.emplace_back();
      s_->check(MPI_Ibcast(detail::mpi::nonnull(buf.data() + at), static_cast<int>(n), MPI_BYTE,
                           root, s_->comm, &op->requests.back()),
                "MPI_Ibcast");
    });
    return request(std::move(op));
  }

  request iall_reduce(std::span<std::byte> buf, comm_type t, reduce_op op) {
    detail::comm_checks::reduction(buf.size(), t, op, "all_reduce");
    auto const [dt, mop] = datatype_and_op(t, op);
    MPI_Datatype const dtype = dt;
    MPI_Op const mpi_op = mop;
    std::size_t const es = comm_type_size(t);
    auto p = start(std::string("all_reduce (") + comm_type_name(t) + ", " + reduce_op_name(op) +
                   ", " + std::to_string(buf.size()) + " bytes)");
    for_chunks(buf.size(), es, [&](std::size_t at, std::size_t n) {
      p->requests.emplace_back();
      s_->check(
          MPI_Iallreduce(MPI_IN_PLACE, detail::mpi::nonnull(buf.data() + at),
                         static_cast<int>(n / es), dtype, mpi_op, s_->comm, &p->requests.back()),
          "MPI_Iallreduce");
    });
    return request(std::move(p));
  }

  request ireduce_scatter(std::span<std::byte const> in, std::span<std::byte> out, comm_type t,
                          reduce_op op) {
    detail::comm_checks::reduce_scatter(in.size(), out.size(), t, op, size());
    detail::mpi::to_int(in.size(), "reduce_scatter input");
    auto const [dt, mop] = datatype_and_op(t, op);
    int const count = static_cast<int>(out.size() / comm_type_size(t));
    auto p = start(std::string("reduce_scatter (") + comm_type_name(t) + ", " + reduce_op_name(op) +
                   ", " + std::to_string(out.size()) + " bytes per rank)");
    p->requests.emplace_back();
    s_->check(
        MPI_Ireduce_scatter_block(detail::mpi::nonnull(in.data()), detail::mpi::nonnull(out.data()),
                                  count, dt, mop, s_->comm, &p->requests.back()),
        "MPI_Ireduce_scatter_block");
    return request(std::move(p));
  }

  request iall_gather(std::span<std::byte const> in, std::span<std::byte> out) {
    detail::comm_checks::all_gather(in.size(), out.size(), size());
    detail::mpi::to_int(out.size(), "all_gather output");
    int const n = static_cast<int>(in.size());
    auto p = start("all_gather (" + std::to_string(in.size()) + " bytes each)");
    p->requests.emplace_back();
    s_->check(MPI_Iallgather(detail::mpi::nonnull(in.data()), n, MPI_BYTE,
                             detail::mpi::nonnull(out.data()), n, MPI_BYTE, s_->comm,
                             &p->requests.back()),
              "MPI_Iallgather");
    return request(std::move(p));
  }

  /// `counts` is copied: it need not outlive the call.
  request iall_gather_v(std::span<std::byte const> in, std::span<std::byte> out,
                        std::span<std::size_t const> counts) {
    detail::comm_checks::all_gather_v(in.size(), out.size(), counts, rank(), size());
    detail::mpi::to_int(out.size(), "all_gather_v output");
    auto p = start("all_gather_v (" + std::to_string(out.size()) + " bytes in all)");
    auto const n = static_cast<std::size_t>(size());
    p->ints.resize(2 * n);
    int at = 0;
    for (std::size_t r = 0; r < n; ++r) {
      p->ints[r] = static_cast<int>(counts[r]);
      p->ints[n + r] = at;
      at += p->ints[r];
    }
    p->requests.emplace_back();
    s_->check(MPI_Iallgatherv(detail::mpi::nonnull(in.data()), static_cast<int>(in.size()),
                              MPI_BYTE, detail::mpi::nonnull(out.data()), p->ints.data(),
                              p->ints.data() + n, MPI_BYTE, s_->comm, &p->requests.back()),
              "MPI_Iallgatherv");
    return request(std::move(p));
  }

  /// The counts are copied: they need not outlive the call.
  request iall_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                        std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    detail::comm_checks::all_to_all_v(in.size(), send_counts, out.size(), recv_counts, size());
    detail::mpi::to_int(in.size(), "all_to_all_v input");
    detail::mpi::to_int(out.size(), "all_to_all_v output");
    auto p = start("all_to_all_v (" + std::to_string(in.size()) + " bytes out, " +
                   std::to_string(out.size()) + " in)");
    auto const n = static_cast<std::size_t>(size());
    p->ints.resize(4 * n);
    int* sc = p->ints.data();
    int* sd = sc + n;
    int* rc = sd + n;
    int* rd = rc + n;
    int sat = 0;
    int rat = 0;
    for (std::size_t r = 0; r < n; ++r) {
      sc[r] = static_cast<int>(send_counts[r]);
      sd[r] = sat;
      sat += sc[r];
      rc[r] = static_cast<int>(recv_counts[r]);
      rd[r] = rat;
      rat += rc[r];
    }
    p->requests.emplace_back();
    s_->check(MPI_Ialltoallv(detail::mpi::nonnull(in.data()), sc, sd, MPI_BYTE,
                             detail::mpi::nonnull(out.data()), rc, rd, MPI_BYTE, s_->comm,
                             &p->requests.back()),
              "MPI_Ialltoallv");
    return request(std::move(p));
  }

  request isend(std::span<std::byte const> in, int peer, int tag) {
    check_p2p(peer, tag, "send peer");
    auto p = start("send of " + std::to_string(in.size()) + " bytes to rank " +
                   std::to_string(peer) + " (tag " + std::to_string(tag) + ")");
    for_chunks(in.size(), 1, [&](std::size_t at, std::size_t n) {
      p->requests.emplace_back();
      s_->check(MPI_Isend(detail::mpi::nonnull(in.data() + at), static_cast<int>(n), MPI_BYTE, peer,
                          tag, s_->comm, &p->requests.back()),
                "MPI_Isend");
    });
    return request(std::move(p));
  }

  /// Receives exactly `out.size()` bytes; a message of another size is a `comm_error`.
  request irecv(std::span<std::byte> out, int peer, int tag) {
    check_p2p(peer, tag, "recv peer");
    auto p = start("recv of " + std::to_string(out.size()) + " bytes from rank " +
                   std::to_string(peer) + " (tag " + std::to_string(tag) + ")");
    p->is_recv = true;
    for_chunks(out.size(), 1, [&](std::size_t at, std::size_t n) {
      p->requests.emplace_back();
      p->expect_bytes.push_back(static_cast<int>(n));
      s_->check(MPI_Irecv(detail::mpi::nonnull(out.data() + at), static_cast<int>(n), MPI_BYTE,
                          peer, tag, s_->comm, &p->requests.back()),
                "MPI_Irecv");
    });
    return request(std::move(p));
  }

 private:
  std::unique_ptr<detail::mpi::pending_op> start(std::string what) {
    s_->check_usable();
    return std::make_unique<detail::mpi::pending_op>(s_, std::move(what));
  }

  std::pair<MPI_Datatype, MPI_Op> datatype_and_op(comm_type t, reduce_op op) {
    try {
      return detail::mpi::datatype_and_op(t, op);
    } catch (comm_error const& e) {
      s_->fail(e.what());
    }
  }

  void check_p2p(int peer, int tag, char const* what) const {
    detail::comm_checks::peer(peer, size(), what);
    detail::comm_checks::tag(tag);
    if (tag > s_->tag_ub) {
      throw config_error("gradcomp: message tag " + std::to_string(tag) +
                         " exceeds this MPI's MPI_TAG_UB (" + std::to_string(s_->tag_ub) + ")");
    }
  }

  // Calls fn(offset, bytes) for each chunk of a buffer of `bytes` bytes, chunks a multiple of
  // `unit` bytes. An empty buffer is one empty chunk, so every rank posts the same calls.
  template <class Fn>
  void for_chunks(std::size_t bytes, std::size_t unit, Fn fn) const {
    std::size_t const chunk = std::max(unit, s_->options.max_chunk_bytes / unit * unit);
    std::size_t at = 0;
    do {
      std::size_t const n = std::min(chunk, bytes - at);
      fn(at, n);
      at += n;
    } while (at < bytes);
  }

  std::shared_ptr<detail::mpi::comm_state> s_;
};

static_assert(communicator<mpi_communicator>);

GRADCOMP_NAMESPACE_END
