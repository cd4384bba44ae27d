// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_soak: a long run of `gradient_pipeline` over in-process ranks that changes its
// configuration at random and checks, as it goes, what must hold however long training runs.
//
//   gradcomp_soak [--steps N] [--seed S] [--ranks R] [--checkpoint-every K]
//                 [--forget-output-at STEP]   (self-check: the mass check must then fail)
//
// The run is a sequence of episodes. Each draws a configuration (codec, error feedback,
// controller — random schedules, GraVAC, Accordion or none —, two-way) and a length, builds one
// pipeline per rank and trains on small tensors with heavy-tailed random gradients. Every K
// steps each rank saves its pipeline, restores the checkpoint into a fresh pipeline, checks that
// the fresh one saves the same bytes and carries on with it. Checked:
//
// - mass conservation (residual error feedback): per element, over the episode,
//   sum over ranks of the gradients == ranks * (sum of the averaged outputs) + sum over ranks of
//   the final residuals, within 8 float32 roundings of the magnitudes involved per step (plus,
//   for fp16 and bf16, whose values are summed in their wire type, that sum's rounding);
// - every output finite;
// - resident memory flat after the warm-up (the first tenth of the steps): growth at most 8 MiB;
// - no growth in open file descriptors or threads between episodes.
//
// The last line is `soak: PASS ...` or `soak: FAIL ...`; the exit status is non-zero on failure.
// scripts/soak runs the long campaign (10^5 steps); ctest runs a short one (label `soak`).

#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/pipeline/pipeline.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gc = gradcomp;

namespace {

// AddressSanitizer keeps freed memory in quarantine (256 MiB by default), so resident memory
// grows under it without a leak; there LeakSanitizer checks for leaks instead of this program.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool check_resident_memory = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool check_resident_memory = false;
#else
constexpr bool check_resident_memory = true;
#endif
#else
constexpr bool check_resident_memory = true;
#endif

struct options {
  std::uint64_t steps = 5000;
  std::uint64_t seed = 1;
  int ranks = 2;
  std::uint64_t checkpoint_every = 97;
  // Self-check of the checker: forget the output of this step (0: never) in the mass
  // accounting, which must then fail (ctest soak.detects_lost_mass).
  std::uint64_t forget_output_at = 0;
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "gradcomp_soak: %s\nusage: gradcomp_soak [--steps N] [--seed S] [--ranks R] "
               "[--checkpoint-every K]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    char* end = nullptr;
    unsigned long long const v = std::strtoull(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0') usage(("not a number after " + a).c_str());
    if (a == "--steps") o.steps = v;
    else if (a == "--seed") o.seed = v;
    else if (a == "--ranks") o.ranks = static_cast<int>(v);
    else if (a == "--checkpoint-every") o.checkpoint_every = v;
    else if (a == "--forget-output-at") o.forget_output_at = v;
    else usage(("unknown option " + a).c_str());
  }
  if (o.ranks < 1 || o.ranks > 16) usage("--ranks must be 1..16");
  if (o.checkpoint_every == 0) usage("--checkpoint-every must be positive");
  return o;
}

// ---- process resources, read from /proc ------------------------------------------------------

std::size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t total = 0, resident = 0;
  f >> total >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

std::size_t count_entries(char const* dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    ++n;
  }
  return n;
}

// ---- episodes --------------------------------------------------------------------------------

struct episode {
  gc::pipeline_options opt;
  std::uint64_t steps = 0;
  bool conserves = false;  // residual error feedback: the mass check applies
  // Unit roundoff of the wire type in which a summable codec's values are summed (fp16, bf16):
  // error feedback corrects each rank's own rounding, not the rounding of the compressed-domain
  // sum, so that much per step and element is outside the conservation law.
  double sum_roundoff = 0.0;
};

std::string random_schedule(std::mt19937_64& rng, std::uint64_t steps) {
  static constexpr double factors[] = {1.0, 4.0, 10.0, 100.0, 1000.0};
  std::string spec = "schedule:0=" + std::to_string(static_cast<int>(factors[rng() % 5]));
  std::uint64_t at = 0;
  for (int k = 0; k < 6; ++k) {
    at += 1 + rng() % (steps / 4 + 1);
    spec += "," + std::to_string(at) + "=" + std::to_string(static_cast<int>(factors[rng() % 5]));
  }
  return spec;
}

episode draw_episode(std::mt19937_64& rng, std::uint64_t steps_left) {
  static char const* const sparsifiers[] = {"topk:ratio=0.01", "approx_topk:ratio=0.01", "randomk:ratio=0.02"};
  static char const* const others[] = {"identity", "fp16",  "bf16",           "int8",          "onebit",
                                       "qsgd:levels=7", "terngrad", "natural", "dithering", "threshold:value=0.5"};
  static char const* const feedbacks[] = {"residual", "residual", "residual", "ef21", "dgc:momentum=0.9", "none"};
  episode e;
  e.steps = std::min<std::uint64_t>(steps_left, 100 + rng() % 900);
  e.opt.seed = rng();
  e.opt.measured_timing = false;
  e.opt.buckets.bucket_bytes = 16 << 10;  // several buckets per step
  e.opt.buckets.min_compress_elements = 1024;
  e.opt.buckets.pipeline = (rng() & 1) != 0;
  switch (rng() % 6) {
    case 0:
    case 1: {  // a sparsifier under a controller
      e.opt.codec = sparsifiers[rng() % 3];
      e.opt.feedback = feedbacks[rng() % 6];
      int const c = static_cast<int>(rng() % 4);
      e.opt.controller = c == 0 ? std::string("gravac") : c == 1 ? std::string("accordion") : random_schedule(rng, e.steps);
      break;
    }
    case 2:
    case 3:  // any codec, no controller
      e.opt.codec = rng() % 3 == 0 ? sparsifiers[rng() % 3] : others[rng() % 10];
      e.opt.feedback = feedbacks[rng() % 6];
      break;
    case 4:  // PowerSGD, with or without its error feedback
      e.opt.codec = rng() % 2 ? "powersgd:rank=2" : "powersgd:rank=1";
      e.opt.feedback = rng() % 2 ? "residual" : "none";
      break;
    default:  // two-way compression
      e.opt.codec = rng() % 2 ? "topk:ratio=0.01" : "onebit";
      e.opt.feedback = "residual";
      e.opt.two_way = true;
      break;
  }
  e.conserves = e.opt.feedback == "residual" && !e.opt.two_way && e.opt.codec.rfind("powersgd", 0) != 0;
  if (e.opt.codec == "fp16") e.sum_roundoff = std::ldexp(1.0, -11);
  if (e.opt.codec == "bf16") e.sum_roundoff = std::ldexp(1.0, -8);
  return e;
}

// Heavy-tailed gradient values; each tensor has its own scale, which drifts over the episode.
void fill_gradient(std::mt19937_64& rng, std::span<float> g, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : g) {
    float const v = normal(rng);
    x = scale * (rng() % 97 == 0 ? 20.0f * v : v);
  }
}

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Conservation accumulators of one rank, per tensor and element (double).
struct mass {
  std::vector<std::vector<double>> grad, out, bound;
};

// One rank's run of an episode. Throws `failure` for a broken property.
void run_rank(gc::in_process_communicator& comm, episode const& ep, std::uint64_t first_step, std::uint64_t seed,
              std::uint64_t checkpoint_every, std::uint64_t forget_output_at, std::vector<std::size_t> const& sizes, mass& m,
              std::vector<std::vector<float>>& final_state, std::size_t& checkpoints) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(comm.rank()));
  auto pipe = std::make_unique<gc::gradient_pipeline>(ep.opt);
  std::vector<std::vector<float>> g(sizes.size());
  std::vector<float> scale(sizes.size());
  m.grad.assign(sizes.size(), {});
  m.out.assign(sizes.size(), {});
  m.bound.assign(sizes.size(), {});
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    g[t].resize(sizes[t]);
    m.grad[t].assign(sizes[t], 0.0);
    m.out[t].assign(sizes[t], 0.0);
    m.bound[t].assign(sizes[t], 0.0);
    scale[t] = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
  }
  double const w = comm.size();
  double const eps = std::numeric_limits<float>::epsilon();
  for (std::uint64_t s = 0; s < ep.steps; ++s) {
    std::vector<gc::tensor_view<float>> views;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      scale[t] *= 1.0f + 0.01f * (static_cast<float>(rng() % 201) - 100.0f) / 100.0f;
      fill_gradient(rng, g[t], scale[t]);
      if (ep.conserves) {
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          m.grad[t][i] += g[t][i];
          m.bound[t][i] += 8.0 * eps * std::fabs(g[t][i]);
        }
      }
      views.emplace_back(std::span<float>(g[t]), static_cast<gc::tensor_id>(t));
    }
    gc::pipeline_step_info info;
    info.batch_size = 32;
    info.backprop_s = 0.01;
    info.learning_rate = 0.1;
    info.next_learning_rate = 0.1;
    (void)pipe->step(comm, views, info);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      auto const state = ep.conserves ? pipe->feedback_state(static_cast<gc::tensor_id>(t)) : std::span<float const>{};
      for (std::size_t i = 0; i < sizes[t]; ++i) {
        if (!std::isfinite(g[t][i])) {
          throw failure("step " + std::to_string(first_step + s) + ": output " + std::to_string(i) + " of tensor " +
                        std::to_string(t) + " is not finite");
        }
        if (ep.conserves && first_step + s != forget_output_at) {
          m.out[t][i] += g[t][i];
          double const e = state.empty() ? 0.0 : std::fabs(state[i]);
          // g + e rounded, the residual's subtraction, the output's sum and average: a few
          // float32 roundings of each magnitude (|g| was added when it was drawn) per step.
          m.bound[t][i] += 8.0 * eps * (e + w * std::fabs(g[t][i])) + ep.sum_roundoff * w * w * std::fabs(g[t][i]);
        }
      }
    }
    if ((first_step + s + 1) % checkpoint_every == 0) {
      std::vector<std::byte> const saved = pipe->save();
      auto fresh = std::make_unique<gc::gradient_pipeline>(ep.opt);
      fresh->load(saved);
      if (fresh->save() != saved) {
        throw failure("step " + std::to_string(first_step + s) + ": a restored pipeline saves other bytes");
      }
      pipe = std::move(fresh);
      ++checkpoints;
    }
  }
  final_state.assign(sizes.size(), {});
  if (ep.conserves) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      auto const state = pipe->feedback_state(static_cast<gc::tensor_id>(t));
      final_state[t].assign(state.begin(), state.end());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  options const o = parse(argc, argv);
  std::mt19937_64 rng(o.seed);
  std::vector<std::size_t> const sizes = {5000, 300, 9000, 2048};
  // The process-wide pool starts its workers on first use, by whichever codec needs it first;
  // start it now so that the thread count is steady from the first episode.
  (void)gc::cpu::default_thread_pool();

  std::uint64_t done = 0, episodes = 0, conserving = 0;
  std::size_t checkpoints = 0;
  double worst = 0.0;  // largest conservation error as a fraction of its bound
  std::set<std::string> codecs, controllers;
  std::size_t rss_warm = 0, rss_peak = 0, fds_base = 0, threads_base = 0;
  bool warm = false;
  auto const t0 = std::chrono::steady_clock::now();
  std::string problem;

  try {
    while (done < o.steps) {
      episode const ep = draw_episode(rng, o.steps - done);
      std::uint64_t const ep_seed = rng();
      std::vector<mass> masses(static_cast<std::size_t>(o.ranks));
      std::vector<std::vector<std::vector<float>>> states(static_cast<std::size_t>(o.ranks));
      std::vector<std::size_t> ckpts(static_cast<std::size_t>(o.ranks), 0);
      gc::run_in_process(o.ranks, [&](gc::in_process_communicator& comm) {
        auto const r = static_cast<std::size_t>(comm.rank());
        run_rank(comm, ep, done, ep_seed, o.checkpoint_every, o.forget_output_at, sizes, masses[r], states[r], ckpts[r]);
      });
      checkpoints += ckpts[0];
      if (ep.conserves) {
        ++conserving;
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          for (std::size_t i = 0; i < sizes[t]; ++i) {
            double lhs = 0.0, rhs = 0.0, bound = 0.0;
            for (std::size_t r = 0; r < masses.size(); ++r) {
              lhs += masses[r].grad[t][i];
              rhs += states[r][t].empty() ? 0.0 : states[r][t][i];
              bound += masses[r].bound[t][i];
            }
            rhs += static_cast<double>(o.ranks) * masses[0].out[t][i];
            double const err = std::fabs(lhs - rhs);
            if (bound > 0.0) worst = std::max(worst, err / bound);
            if (err > bound) {
              throw failure("episode " + std::to_string(episodes) + " (" + ep.opt.codec + ", " + ep.opt.feedback + ", '" +
                            ep.opt.controller + "'): tensor " + std::to_string(t) + " element " + std::to_string(i) +
                            " loses mass: sum of gradients " + std::to_string(lhs) + ", sent + residual " +
                            std::to_string(rhs) + ", bound " + std::to_string(bound));
            }
          }
        }
      }
      codecs.insert(ep.opt.codec.substr(0, ep.opt.codec.find(':')) + (ep.opt.two_way ? "/two-way" : ""));
      controllers.insert(ep.opt.controller.empty() ? "none" : ep.opt.controller.substr(0, ep.opt.controller.find(':')));
      done += ep.steps;
      ++episodes;

      // Resources, between episodes (no rank threads alive).
      std::size_t const rss = resident_bytes();
      std::size_t const fds = count_entries("/proc/self/fd");
      std::size_t const threads = count_entries("/proc/self/task");
      if (!warm && done >= o.steps / 10) {
        warm = true;
        rss_warm = rss;
        fds_base = fds;
        threads_base = threads;
      } else if (warm) {
        rss_peak = std::max(rss_peak, rss);
        if (fds > fds_base) throw failure("open file descriptors grew from " + std::to_string(fds_base) + " to " + std::to_string(fds));
        if (threads > threads_base) {
          throw failure("threads grew from " + std::to_string(threads_base) + " to " + std::to_string(threads));
        }
      }
    }
    if (check_resident_memory && rss_peak > rss_warm + (std::size_t{8} << 20)) {
      throw failure("resident memory grew from " + std::to_string(rss_warm >> 10) + " KiB after the warm-up to " +
                    std::to_string(rss_peak >> 10) + " KiB");
    }
  } catch (std::exception const& e) {
    problem = e.what();
  }

  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string codec_list, controller_list;
  for (auto const& c : codecs) codec_list += (codec_list.empty() ? "" : ",") + c;
  for (auto const& c : controllers) controller_list += (controller_list.empty() ? "" : ",") + c;
  std::printf("steps %llu in %llu episodes (%llu with the mass check), %zu checkpoint restores, %d ranks, %.1f s\n",
              static_cast<unsigned long long>(done), static_cast<unsigned long long>(episodes),
              static_cast<unsigned long long>(conserving), checkpoints, o.ranks, seconds);
  std::printf("codecs: %s\ncontrollers: %s\n", codec_list.c_str(), controller_list.c_str());
  std::printf("conservation: worst error %.3g of its bound\n", worst);
  std::printf("resident memory: %zu KiB after warm-up, %zu KiB at most later%s; fds %zu, threads %zu\n", rss_warm >> 10,
              rss_peak >> 10, check_resident_memory ? "" : " (not checked under AddressSanitizer)", fds_base,
              threads_base);
  if (!problem.empty()) {
    std::printf("soak: FAIL (seed %llu): %s\n", static_cast<unsigned long long>(o.seed), problem.c_str());
    return 1;
  }
  std::printf("soak: PASS (seed %llu)\n", static_cast<unsigned long long>(o.seed));
  return 0;
}
