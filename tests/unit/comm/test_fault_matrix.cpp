// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// The fault matrix: faults × collectives (fault_matrix_support.hpp has the rules each cell
// checks). Subjects: all_reduce_compressed for each aggregation kind (with error feedback),
// two-way, the parameter server (a faulty worker and a faulty server), the bucketed collective
// (a gather and a summable configuration, several buckets, dense buckets), the agreement
// primitives, gossip (blocking and overlapped), and the gradient pipeline (a controller with
// layer accumulation and EF21, a summable codec, PowerSGD, two-way). The agreement rounds are
// a phase of every collective: the faults hit them as they hit every other operation.

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/collective/bucket.hpp>
#include <gradcomp/collective/outcome.hpp>
#include <gradcomp/collective/parameter_server.hpp>
#include <gradcomp/collective/powersgd_session.hpp>
#include <gradcomp/collective/two_way.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/feedback/compressor.hpp>
#include <gradcomp/feedback/policies.hpp>
#include <gradcomp/optim/adam.hpp>
#include <gradcomp/optim/comm_mixer.hpp>
#include <gradcomp/optim/decentralized.hpp>
#include <gradcomp/pipeline/pipeline.hpp>
#include <gradcomp/topology/topology.hpp>

#include "fault_matrix_support.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <vector>

using namespace fault_matrix;

namespace {

constexpr gc::tensor_id tid{3};

gc::codec_context context(int rank, int step, bool shared) {
  gc::codec_context ctx;
  ctx.seed = shared ? 5u : 5u + static_cast<std::uint64_t>(rank);
  ctx.step = static_cast<std::uint32_t>(step);
  ctx.parallel_threshold = std::numeric_limits<std::size_t>::max();
  return ctx;
}

// all_reduce_compressed with a compressor (error feedback).
template <class Feedback>
class arc_model final : public model {
 public:
  arc_model(std::string const& spec, bool checksum, bool shared)
      : comp_(gc::make_codec(spec)), checksum_(checksum), shared_(shared) {}
  bytes state() const override { return comp_.save(); }
  bytes step(fcomm& c, int s) override {
    std::vector<float> const g = gradient(c.rank(), s, 900);
    std::vector<float> out(g.size());
    gc::all_reduce_compressed(c, comp_, gc::tensor_view<float const>(g, tid), std::span<float>(out),
                              context(c.rank(), s, shared_),
                              {.op = gc::reduction::average, .checksum = checksum_});
    return to_bytes(out);
  }

 private:
  gc::compressor<gc::any_codec, Feedback> comp_;
  bool checksum_, shared_;
};

// all_reduce_compressed with a PowerSGD session (the low-rank kind).
class low_rank_model final : public model {
 public:
  explicit low_rank_model(bool checksum)
      : session_(30, 40, {.rank = 2, .min_elements = 0}, tid), checksum_(checksum) {}
  bytes state() const override {
    gc::detail::byte_writer w;
    w.begin("TEST", 1);
    session_.state().save_exact(w);
    return w.finish();
  }
  bytes step(fcomm& c, int s) override {
    std::vector<float> const g = gradient(c.rank(), s, 1200);
    std::vector<float> out(g.size());
    gc::all_reduce_compressed(c, session_, gc::tensor_view<float const>(g, tid),
                              std::span<float>(out), context(c.rank(), s, true),
                              {.op = gc::reduction::average, .checksum = checksum_});
    return to_bytes(out);
  }

 private:
  gc::powersgd_session session_;
  bool checksum_;
};

class two_way_model final : public model {
 public:
  explicit two_way_model(bool checksum)
      : tw_(gc::make_codec("topk:ratio=0.1")), checksum_(checksum) {}
  bytes state() const override { return tw_.save(); }
  bytes step(fcomm& c, int s) override {
    std::vector<float> const g = gradient(c.rank(), s, 900);
    std::vector<float> out(g.size());
    gc::all_reduce_two_way(c, tw_, gc::tensor_view<float const>(g, tid), std::span<float>(out),
                           context(c.rank(), s, false),
                           {.op = gc::reduction::average, .checksum = checksum_});
    return to_bytes(out);
  }

 private:
  gc::two_way_compressor<gc::any_codec> tw_;
  bool checksum_;
};

class ps_model final : public model {
 public:
  explicit ps_model(bool checksum) : tw_(gc::make_codec("topk:ratio=0.1")), checksum_(checksum) {}
  bytes state() const override { return tw_.save(); }
  bytes step(fcomm& c, int s) override {
    gc::ps_options const opt{.servers = 1, .op = gc::reduction::average, .checksum = checksum_};
    if (gc::is_server(c, opt)) {
      gc::ps_serve(c, tw_, tid, 900, context(c.rank(), s, false), opt);
      return {};
    }
    std::vector<float> const g = gradient(c.rank(), s, 900);
    std::vector<float> out(g.size());
    gc::ps_push_pull(c, tw_, gc::tensor_view<float const>(g, tid), std::span<float>(out),
                     context(c.rank(), s, false), opt);
    return to_bytes(out);
  }

 private:
  gc::two_way_compressor<gc::any_codec> tw_;
  bool checksum_;
};

// bucketed_all_reduce over five tensors: two or three compressed buckets, dense buckets.
class bucket_model final : public model {
 public:
  bucket_model(std::string const& spec, gc::bucket_compression mode, gc::dense_format small,
               bool checksum)
      : b_(gc::compressor<gc::any_codec, gc::residual_feedback>(gc::make_codec(spec)),
           {.bucket_bytes = 4000,
            .min_compress_elements = 300,
            .small_format = small,
            .mode = mode,
            .op = gc::reduction::average,
            .checksum = checksum}) {}
  bytes state() const override { return b_.source().save(); }
  bytes step(fcomm& c, int s) override {
    std::vector<std::size_t> const sizes = {700, 60, 800, 90, 500};
    std::vector<std::vector<float>> g, out;
    std::vector<gc::bucket_item> items;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      g.push_back(gradient(c.rank(), s, sizes[t], static_cast<std::uint32_t>(t)));
      out.emplace_back(sizes[t]);
    }
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      items.push_back({gc::tensor_view<float const>(g[t], static_cast<gc::tensor_id>(t)),
                       std::span<float>(out[t])});
    }
    b_.run(c, std::span<gc::bucket_item const>(items), context(c.rank(), s, false));
    bytes o;
    for (auto const& v : out) append(o, std::span<float const>(v));
    return o;
  }

 private:
  mutable gc::bucketed_all_reduce<gc::compressor<gc::any_codec, gc::residual_feedback>> b_;
};

// The agreement primitives as a step: a configuration check, a value chosen by rank 0, and the
// step-outcome round closing it.
class agreement_model final : public model {
 public:
  explicit agreement_model(bool checksum) : checksum_(checksum) {}
  bytes state() const override { return {}; }
  bytes step(fcomm& c, int s) override {
    gc::agree(c, gc::fingerprint{}.add("matrix").add(static_cast<std::uint64_t>(s)).value(),
              "matrix", checksum_);
    std::uint64_t const v = gc::agree_on_value(
        c, std::uint64_t{40} + static_cast<std::uint64_t>(c.rank()), 0, checksum_);
    gc::agree_on_outcome(c, nullptr, "matrix");
    return to_bytes(std::vector<std::uint64_t>{v});
  }

 private:
  bool checksum_;
};

// Decentralized Adam over a comm_mixer (static ring of 4): the blocking form (mix, then
// update) or the overlapped one (the exchange of x^(k+1) launched at the end of iteration k and
// completed in iteration k+1). State: the parameters, Adam's moments, the iteration count.
class gossip_model final : public model {
 public:
  using mixer = gc::comm_mixer<fcomm>;
  gossip_model(int ranks, bool overlapped, bool checksum)
      : ranks_(ranks), overlapped_(overlapped), x_(gradient(0, 99, 400)), checksum_(checksum) {}
  bytes state() const override {
    bytes b = to_bytes(x_);
    if (opt_) {
      append(b, opt_->optimizer().first_moment());
      append(b, opt_->optimizer().second_moment());
      append(b, std::span<std::uint64_t const>(
                    std::vector<std::uint64_t>{opt_->optimizer().steps(), opt_->steps()}));
    }
    return b;
  }
  bytes step(fcomm& c, int s) override {
    std::vector<float> const g = gradient(c.rank(), s, x_.size());
    gc::comm_mixer_options const mo{.agree_outcome = true, .checksum = checksum_};
    if (!opt_) {
      opt_.emplace(gc::adam({.lr = 0.01}), mixer(c, gc::topology::static_ring(ranks_), mo));
    } else if (!opt_->pending()) {
      opt_->mixer() = mixer(c, gc::topology::static_ring(ranks_), mo);  // a new world
    }
    if (overlapped_) {
      if (!opt_->pending()) opt_->start(x_);
      opt_->step(std::span<float>(x_), std::span<float const>(g));
    } else {
      opt_->step_blocking(std::span<float>(x_), std::span<float const>(g));
    }
    return to_bytes(x_);
  }

 private:
  int ranks_;
  bool overlapped_;
  std::vector<float> x_;
  bool checksum_;
  std::optional<gc::decentralized_optimizer<gc::adam, mixer>> opt_;
};

class pipeline_model final : public model {
 public:
  explicit pipeline_model(gc::pipeline_options o) : pipe_(std::move(o)) {}
  bytes state() const override { return pipe_.save(); }
  bytes step(fcomm& c, int s) override { return fault_steps::pipeline_step(pipe_, c, s); }

 private:
  gc::gradient_pipeline pipe_;
};

gc::pipeline_options pipeline_options(std::string codec, std::string feedback,
                                      std::string controller, bool two_way, bool checksum) {
  gc::pipeline_options o;
  o.codec = std::move(codec);
  o.feedback = std::move(feedback);
  o.controller = std::move(controller);
  o.two_way = two_way;
  o.seed = 11;
  o.measured_timing = false;
  o.buckets.min_compress_elements = 1000;
  o.buckets.bucket_bytes = 8000;  // several buckets
  o.buckets.checksum = checksum;
  o.context.parallel_threshold = std::numeric_limits<std::size_t>::max();
  return o;
}

void check(subject const& s) {
  auto const t0 = std::chrono::steady_clock::now();
  tally const t = run_matrix(s);
  double const secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string all;
  for (auto const& p : t.problems) all += "\n  " + p;
  INFO(s.name << ": " << t.cells << " cells, " << t.failed << " failed on every rank as required, "
              << t.succeeded << " succeeded bit-identically (" << t.harmless
              << " with a fault that changed nothing that matters), " << t.split
              << " outcome-round splits, " << t.slow_reruns << " cells re-run with the slow times, "
              << secs << " s" << all);
  CHECK(t.problems.empty());
  CHECK(t.cells > 0);
  WARN(s.name << ": " << t.cells << " cells in " << secs << " s (" << t.failed
              << " failed everywhere, " << t.succeeded << " succeeded, " << t.split
              << " outcome-round splits; " << t.slow_reruns << " re-run with the slow times)");
}

}  // namespace

TEST_CASE("fault matrix: all_reduce_compressed, every aggregation kind", "[faults][collective]") {
  check({"all_reduce_compressed summable (fp16, residual)", 3, {1}, [](int, bool cs) {
           return std::make_unique<arc_model<gc::residual_feedback>>("fp16", cs, false);
         }});
  check({"all_reduce_compressed shared support (randomk, residual)", 3, {1}, [](int, bool cs) {
           return std::make_unique<arc_model<gc::residual_feedback>>("randomk:ratio=0.1", cs, true);
         }});
  check({"all_reduce_compressed gather (topk, residual)", 3, {1}, [](int, bool cs) {
           return std::make_unique<arc_model<gc::residual_feedback>>("topk:ratio=0.05", cs, false);
         }});
  check({"all_reduce_compressed gather (topk, EF21 with its receiver)", 3, {1}, [](int, bool cs) {
           return std::make_unique<arc_model<gc::ef21_feedback>>("topk:ratio=0.05", cs, false);
         }});
  check({"all_reduce_compressed low-rank (PowerSGD session)", 3, {1}, [](int, bool cs) {
           return std::make_unique<low_rank_model>(cs);
         }});
}

TEST_CASE("fault matrix: two-way and parameter server", "[faults][collective]") {
  check({"all_reduce_two_way (topk, both residuals)", 3, {1}, [](int, bool cs) {
           return std::make_unique<two_way_model>(cs);
         }});
  check({"parameter server (2 workers, 1 server)", 3, {1, 2}, [](int, bool cs) {
           return std::make_unique<ps_model>(cs);
         }});
}

TEST_CASE("fault matrix: bucketed all-reduce and the agreement primitives",
          "[faults][collective]") {
  check({"bucketed_all_reduce (topk per tensor, f32 dense buckets)", 3, {1}, [](int, bool cs) {
           return std::make_unique<bucket_model>(
               "topk:ratio=0.05", gc::bucket_compression::per_tensor, gc::dense_format::f32, cs);
         }});
  check({"bucketed_all_reduce (fp16 per bucket, bf16 dense buckets)", 3, {1}, [](int, bool cs) {
           return std::make_unique<bucket_model>("fp16", gc::bucket_compression::per_bucket,
                                                 gc::dense_format::bf16, cs);
         }});
  check({"agree, agree_on_value, agree_on_outcome", 3, {1}, [](int, bool cs) {
           return std::make_unique<agreement_model>(cs);
         }});
}

TEST_CASE("fault matrix: gradient_pipeline", "[faults][pipeline]") {
  check({"gradient_pipeline (topk, EF21, Accordion)", 3, {1}, [](int, bool cs) {
           return std::make_unique<pipeline_model>(
               pipeline_options("topk:ratio=0.05", "ef21",
                                "accordion:low=2,high=40,interval=3,accumulation=2", false, cs));
         }});
  check({"gradient_pipeline (fp16, residual)", 3, {1}, [](int, bool cs) {
           return std::make_unique<pipeline_model>(
               pipeline_options("fp16", "residual", "", false, cs));
         }});
  check({"gradient_pipeline (PowerSGD)", 3, {1}, [](int, bool cs) {
           return std::make_unique<pipeline_model>(
               pipeline_options("powersgd:rank=2,min_elements=0", "residual", "", false, cs));
         }});
  check({"gradient_pipeline (topk, two-way)", 3, {1}, [](int, bool cs) {
           return std::make_unique<pipeline_model>(
               pipeline_options("topk:ratio=0.05", "residual", "", true, cs));
         }});
}

TEST_CASE("fault matrix: gossip, blocking and overlapped", "[faults][optim]") {
  check({"gossip: decentralized Adam, blocking (comm_mixer, agree_outcome)",
         4,
         {1},
         [](int, bool cs) { return std::make_unique<gossip_model>(4, false, cs); }});
  check({"gossip: decentralized Adam, overlapped (comm_mixer, agree_outcome)",
         4,
         {1},
         [](int, bool cs) { return std::make_unique<gossip_model>(4, true, cs); },
         true});
}
