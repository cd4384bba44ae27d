// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp_demo — a tour of every CPU codec on a synthetic but realistic gradient stream.
//
// For each codec the program trains nothing: it replays the same stream of per-layer gradients
// (see `gradient_stream` below) through two `gradcomp::compressor`s, one without error feedback
// and one with residual error feedback (EF-SGD), and reports
//
//   bytes/step      bytes on the wire per step, all layers, packet headers included
//   ratio           fp32 bytes / wire bytes
//   step err        ‖x̂ − g‖ / ‖g‖ of one step without feedback, over the whole model,
//                   averaged over the steps (the codec's own distortion)
//   run err         ‖Σ_t x̂_t − Σ_t g_t‖ / ‖Σ_t g_t‖ after all steps, without and with
//                   feedback: how far what the receivers summed is from what they should have
//   GB/s            fp32 input bytes per second of compress and decompress (no feedback),
//                   and of the feedback compress (which also adds the residual and decodes)
//
// Usage: gradcomp_demo [--steps N] [--elements N] [--threads N] [--csv FILE] [--codec SPEC]...

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

namespace gc = gradcomp;

// ---------------------------------------------------------------------------------------------
// Random numbers: xoshiro256** and the polar method. Fast and reproducible on every platform (the
// standard distributions are not specified bit for bit).
// ---------------------------------------------------------------------------------------------
class rng {
 public:
  explicit rng(std::uint64_t seed) {
    for (auto& w : s_) {  // splitmix64 expands the seed
      seed += 0x9e3779b97f4a7c15ull;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  std::uint64_t next() noexcept {
    std::uint64_t const r = std::rotl(s_[1] * 5, 7) * 9;
    std::uint64_t const t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return r;
  }
  /// Uniform in (0, 1).
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }
  /// Standard normal (Marsaglia's polar method, in float: the stream needs speed, not the
  /// last bits of the tails).
  float normal() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    for (;;) {
      std::uint64_t const r = next();
      float const u = static_cast<float>(static_cast<std::int32_t>(r >> 32)) * 0x1p-31f;
      float const v = static_cast<float>(static_cast<std::int32_t>(r & 0xffffffffu)) * 0x1p-31f;
      float const q = u * u + v * v;
      if (q >= 1.0f || q == 0.0f) continue;
      float const f = std::sqrt(-2.0f * std::log(q) / q);
      spare_ = v * f;
      has_spare_ = true;
      return u * f;
    }
  }

 private:
  std::uint64_t s_[4];
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

// ---------------------------------------------------------------------------------------------
// The model: a small transformer-like network sized to about `elements` parameters.
// ---------------------------------------------------------------------------------------------
enum class layer_kind { embedding, weight, bias, norm };

struct layer {
  std::string name;
  layer_kind kind;
  std::size_t rows;
  std::size_t cols;
  float rms;  // typical gradient RMS of this layer
  [[nodiscard]] std::size_t size() const { return rows * cols; }
};

// Embedding V x d (V = 8d), `blocks` transformer blocks (norms, qkv, attention output, MLP
// d -> 4d -> d, with biases), a final norm and a 64-way head: about 32 d^2 parameters.
std::vector<layer> make_model(std::size_t elements) {
  std::size_t d = static_cast<std::size_t>(std::sqrt(static_cast<double>(elements) / 32.0));
  d = std::max<std::size_t>(16, d / 16 * 16);
  std::size_t const blocks = 2;
  std::vector<layer> m;
  m.push_back({"embed", layer_kind::embedding, 8 * d, d, 2e-3f});
  for (std::size_t b = 0; b < blocks; ++b) {
    std::string const p = "block" + std::to_string(b) + ".";
    // Gradients shrink towards the input (deeper blocks here = closer to the loss = larger).
    float const depth = std::pow(1.6f, static_cast<float>(b));
    m.push_back({p + "ln1.gain", layer_kind::norm, 1, d, 1e-2f * depth});
    m.push_back({p + "ln1.bias", layer_kind::bias, 1, d, 6e-3f * depth});
    m.push_back({p + "attn.qkv.weight", layer_kind::weight, 3 * d, d, 8e-4f * depth});
    m.push_back({p + "attn.qkv.bias", layer_kind::bias, 1, 3 * d, 3e-3f * depth});
    m.push_back({p + "attn.out.weight", layer_kind::weight, d, d, 1.5e-3f * depth});
    m.push_back({p + "attn.out.bias", layer_kind::bias, 1, d, 5e-3f * depth});
    m.push_back({p + "ln2.gain", layer_kind::norm, 1, d, 1e-2f * depth});
    m.push_back({p + "ln2.bias", layer_kind::bias, 1, d, 6e-3f * depth});
    m.push_back({p + "mlp.up.weight", layer_kind::weight, 4 * d, d, 1.2e-3f * depth});
    m.push_back({p + "mlp.up.bias", layer_kind::bias, 1, 4 * d, 4e-3f * depth});
    m.push_back({p + "mlp.down.weight", layer_kind::weight, d, 4 * d, 1e-3f * depth});
    m.push_back({p + "mlp.down.bias", layer_kind::bias, 1, d, 5e-3f * depth});
  }
  m.push_back({"final_ln.gain", layer_kind::norm, 1, d, 2e-2f});
  m.push_back({"final_ln.bias", layer_kind::bias, 1, d, 1e-2f});
  m.push_back({"head.weight", layer_kind::weight, 64, d, 2e-2f});
  m.push_back({"head.bias", layer_kind::bias, 1, 64, 3e-2f});
  return m;
}

// ---------------------------------------------------------------------------------------------
// The gradient stream. Element i of a layer at step t is
//
//   g_t[i] = c_t * s[i] * (0.4 * mu[i] + a_t[i]),   a_t = 0.7 a_{t-1} + sqrt(1 - 0.7^2) xi_t
//
// - s[i] > 0 is a fixed log-normal magnitude: for a weight matrix the product of a row factor,
//   a column factor and an element factor (log-std 0.5, 0.3 and 0.4), so some units and some
//   inputs always get larger gradients; the mixture makes values heavy-tailed (excess kurtosis
//   around 15-20 rather than 0). Each layer's s is normalised to its `rms` and jittered by a
//   per-layer log-normal factor: layers differ in scale by about two orders of magnitude.
// - mu[i] ~ N(0, 1) is a persistent direction (the "true" gradient); a_t is AR(1) noise with
//   lag-1 correlation 0.7 (xi_t ~ N(0, 1)): consecutive steps are strongly correlated.
// - c_t = 0.97^t: the gradient norm decays slowly, as the loss does.
// - The embedding's rows are token rows: each step only rows drawn with Zipf-like
//   probabilities min(1, 2 / (r + 1)^0.8) are non-zero (about 2 % of rows); the rest are
//   exact zeros.
// Everything comes from one seed, so every codec sees exactly the same stream.
// ---------------------------------------------------------------------------------------------
class gradient_stream {
 public:
  gradient_stream(std::vector<layer> const& model, std::uint64_t seed) : model_(model), rng_(seed) {
    for (layer const& l : model_) {
      state s;
      s.scale.resize(l.size());
      s.mean.resize(l.size());
      s.ar.resize(l.size());
      float const jitter = std::exp(0.5f * rng_.normal());
      std::vector<float> row(l.rows), col(l.cols);
      for (float& r : row)
        r = std::exp((l.kind == layer_kind::weight ? 0.5f : 0.2f) * rng_.normal());
      for (float& c : col) c = std::exp(0.3f * rng_.normal());
      double sumsq = 0.0;
      for (std::size_t r = 0; r < l.rows; ++r) {
        for (std::size_t c = 0; c < l.cols; ++c) {
          float const v = row[r] * col[c] * std::exp(0.4f * rng_.normal());
          s.scale[r * l.cols + c] = v;
          sumsq += static_cast<double>(v) * v;
        }
      }
      float const norm =
          l.rms * jitter / static_cast<float>(std::sqrt(sumsq / static_cast<double>(l.size())));
      for (float& v : s.scale) v *= norm;
      for (float& v : s.mean) v = rng_.normal();
      for (float& v : s.ar) v = rng_.normal();
      states_.push_back(std::move(s));
    }
  }

  /// Writes the next step's gradient of every layer into `g` (resized as needed).
  void next(std::vector<std::vector<float>>& g) {
    g.resize(model_.size());
    float const c = std::pow(0.97f, static_cast<float>(step_));
    float const rho = step_ == 0 ? 1.0f : 0.7f;
    float const fresh = std::sqrt(1.0f - rho * rho);
    for (std::size_t k = 0; k < model_.size(); ++k) {
      layer const& l = model_[k];
      state& s = states_[k];
      g[k].resize(l.size());
      for (std::size_t r = 0; r < l.rows; ++r) {
        bool active = true;
        if (l.kind == layer_kind::embedding) {
          double const p = std::min(1.0, 2.0 / std::pow(static_cast<double>(r + 1), 0.8));
          active = rng_.uniform() < p;
        }
        for (std::size_t i = r * l.cols; i < (r + 1) * l.cols; ++i) {
          if (!active) {
            g[k][i] = 0.0f;
            continue;
          }
          s.ar[i] = rho * s.ar[i] + (fresh != 0.0f ? fresh * rng_.normal() : 0.0f);
          g[k][i] = c * s.scale[i] * (0.4f * s.mean[i] + s.ar[i]);
        }
      }
    }
    ++step_;
  }

 private:
  struct state {
    std::vector<float> scale, mean, ar;
  };
  std::vector<layer> model_;
  std::vector<state> states_;
  rng rng_;
  std::uint32_t step_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Running one codec over the stream.
// ---------------------------------------------------------------------------------------------
struct codec_entry {
  std::string label;
  std::string spec;
};

std::vector<codec_entry> default_codecs() {
  return {
      {"identity (fp32)", "identity"},
      {"fp16", "fp16"},
      {"bf16", "bf16"},
      {"int8 nearest", "int8:bucket=512,rounding=nearest"},
      {"int8 stochastic", "int8:bucket=512,rounding=stochastic"},
      {"onebit scaled", "onebit:scaling=mean_abs"},
      {"onebit unscaled (±1)", "onebit:scaling=none"},
      {"qsgd s=7", "qsgd:levels=7,bucket=512"},
      {"qsgd s=127", "qsgd:levels=127,bucket=512"},
      {"terngrad", "terngrad:bucket=512"},
      {"natural", "natural:bucket=512"},
      {"dither linear s=2 max", "dithering:levels=2,partition=linear,norm=max,bucket=512"},
      {"dither natural s=8 max", "dithering:levels=8,partition=natural,norm=max,bucket=512"},
      {"dither linear s=2 l2", "dithering:levels=2,partition=linear,norm=l2,bucket=512"},
      {"approx top-k 1%", "approx_topk:ratio=0.01"},
      {"random-k 1%", "randomk:ratio=0.01"},
      {"random-k 1% scaled", "randomk:ratio=0.01,scale=true"},
      {"powersgd rank 4", "powersgd:rank=4"},
  };
}

// PowerSGD is stateful and shaped (each layer's rows x cols; its own error feedback), so it is
// not an any_codec: `powersgd` specs run through gradcomp::make_powersgd instead.
bool is_powersgd(std::string const& spec) { return spec.rfind("powersgd", 0) == 0; }

struct result {
  codec_entry codec;
  double bytes_per_step = 0;
  double ratio = 0;
  double step_err = 0;
  double run_err_plain = 0;
  double run_err_ef = -1;   // < 0: not run
  double conservation = 0;  // ‖Σ decoded + residual − Σ g‖ / ‖Σ g‖ with feedback
  double compress_gbs = 0;
  double decompress_gbs = 0;
  double ef_compress_gbs = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ‖a - b‖² and ‖b‖², accumulated in double.
void add_error(std::span<float const> a, std::span<float const> b, double& diff2, double& ref2) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const d = static_cast<double>(a[i]) - b[i];
    diff2 += d * d;
    ref2 += static_cast<double>(b[i]) * b[i];
  }
}

// One PowerSGD run per layer shape: without feedback (each step compresses its gradient alone)
// and with its built-in error feedback; the same columns as run_codec.
result run_powersgd(codec_entry const& entry, std::vector<layer> const& model, int steps,
                    std::uint64_t seed, gc::cpu::thread_pool& pool) {
  gc::powersgd fed = gc::make_powersgd(entry.spec);
  gc::powersgd_options no_feedback = fed.options();
  no_feedback.error_feedback = false;
  gc::powersgd plain_codec(no_feedback);
  std::size_t total = 0, largest = 0, max_packet = 0;
  for (layer const& l : model) {
    total += l.size();
    largest = std::max(largest, l.size());
    max_packet = std::max(max_packet, fed.max_compressed_bytes(l.rows, l.cols));
  }
  std::vector<std::byte> packet(max_packet);
  std::vector<float> decoded(largest);
  std::vector<std::vector<float>> g, sum_g(model.size()), sent_plain(model.size()), sent_ef(model.size());
  for (std::size_t k = 0; k < model.size(); ++k) {
    sum_g[k].assign(model[k].size(), 0.0f);
    sent_plain[k].assign(model[k].size(), 0.0f);
    sent_ef[k].assign(model[k].size(), 0.0f);
  }
  gradient_stream stream(model, seed);
  double t_comp = 0, t_decomp = 0, t_ef = 0, bytes = 0, step_err = 0;
  for (int t = 0; t < steps; ++t) {
    stream.next(g);
    gc::codec_context ctx;
    ctx.seed = seed;
    ctx.step = static_cast<std::uint32_t>(t);
    ctx.pool = &pool;
    double diff2 = 0, ref2 = 0;
    for (std::size_t k = 0; k < model.size(); ++k) {
      layer const& l = model[k];
      gc::tensor_view<float const> const view(g[k], static_cast<gc::tensor_id>(k));
      std::span<float> const out(decoded.data(), g[k].size());
      for (std::size_t i = 0; i < g[k].size(); ++i) sum_g[k][i] += g[k][i];
      auto t0 = std::chrono::steady_clock::now();
      std::size_t const n_bytes = plain_codec.compress(view, l.rows, l.cols, packet, ctx);
      t_comp += seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      gc::powersgd::decompress(std::span<std::byte const>(packet.data(), n_bytes), out, ctx);
      t_decomp += seconds_since(t0);
      bytes += static_cast<double>(n_bytes);
      add_error(out, g[k], diff2, ref2);
      for (std::size_t i = 0; i < out.size(); ++i) sent_plain[k][i] += out[i];
      t0 = std::chrono::steady_clock::now();
      std::size_t const e_bytes = fed.compress(view, l.rows, l.cols, packet, ctx);
      t_ef += seconds_since(t0);
      gc::powersgd::decompress_add(std::span<std::byte const>(packet.data(), e_bytes), std::span<float>(sent_ef[k]),
                                   1.0f, ctx);
    }
    step_err += ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0;
  }
  auto run_error = [&](std::vector<std::vector<float>> const& sent) {
    double diff2 = 0, ref2 = 0;
    for (std::size_t k = 0; k < model.size(); ++k) add_error(sent[k], sum_g[k], diff2, ref2);
    return ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0;
  };
  double const in_bytes = 4.0 * static_cast<double>(total) * steps;
  result r;
  r.codec = entry;
  r.bytes_per_step = bytes / steps;
  r.ratio = in_bytes / bytes;
  r.step_err = step_err / steps;
  r.run_err_plain = run_error(sent_plain);
  r.run_err_ef = run_error(sent_ef);
  for (std::size_t k = 0; k < model.size(); ++k) {
    gc::powersgd_state const* st = fed.find(static_cast<gc::tensor_id>(k));
    if (st == nullptr) continue;
    std::vector<float> const e = st->residual();
    for (std::size_t i = 0; i < e.size(); ++i) sent_ef[k][i] += e[i];
  }
  r.conservation = run_error(sent_ef);
  r.compress_gbs = in_bytes / t_comp / 1e9;
  r.decompress_gbs = in_bytes / t_decomp / 1e9;
  r.ef_compress_gbs = in_bytes / t_ef / 1e9;
  return r;
}

result run_codec(codec_entry const& entry, std::vector<layer> const& model, int steps,
                 std::uint64_t seed, gc::cpu::thread_pool& pool) {
  if (is_powersgd(entry.spec)) return run_powersgd(entry, model, steps, seed, pool);
  gc::any_codec const codec = gc::make_codec(entry.spec);
  bool const with_ef = entry.spec != "identity";  // feedback on a lossless codec does nothing
  gc::compressor<gc::any_codec, gc::no_feedback> plain(codec);
  gc::compressor<gc::any_codec, gc::residual_feedback> fed(codec);

  std::size_t total = 0, largest = 0, max_packet = 0;
  for (layer const& l : model) {
    total += l.size();
    largest = std::max(largest, l.size());
    max_packet = std::max(max_packet, codec.max_compressed_bytes(l.size()));
  }
  std::vector<std::byte> packet(max_packet);
  std::vector<float> decoded(largest);
  std::vector<std::vector<float>> g, sum_g(model.size()), sent_plain(model.size()),
      sent_ef(model.size());
  for (std::size_t k = 0; k < model.size(); ++k) {
    sum_g[k].assign(model[k].size(), 0.0f);
    sent_plain[k].assign(model[k].size(), 0.0f);
    if (with_ef) sent_ef[k].assign(model[k].size(), 0.0f);
  }

  gradient_stream stream(model, seed);
  double t_comp = 0, t_decomp = 0, t_ef = 0, bytes = 0, step_err = 0;
  for (int t = 0; t < steps; ++t) {
    stream.next(g);
    gc::codec_context ctx;
    ctx.seed = seed;
    ctx.step = static_cast<std::uint32_t>(t);
    ctx.pool = &pool;
    double diff2 = 0, ref2 = 0;
    for (std::size_t k = 0; k < model.size(); ++k) {
      auto const id = static_cast<gc::tensor_id>(k);
      gc::tensor_view<float const> const view(g[k], id);
      std::span<float> const out(decoded.data(), g[k].size());
      for (std::size_t i = 0; i < g[k].size(); ++i) sum_g[k][i] += g[k][i];

      // Without feedback: the codec alone.
      auto t0 = std::chrono::steady_clock::now();
      std::size_t const n_bytes = plain.compress(view, packet, ctx);
      t_comp += seconds_since(t0);
      std::span<std::byte const> const sent(packet.data(), n_bytes);
      t0 = std::chrono::steady_clock::now();
      plain.decompress(sent, out, ctx);
      t_decomp += seconds_since(t0);
      bytes += static_cast<double>(n_bytes);
      add_error(out, g[k], diff2, ref2);
      for (std::size_t i = 0; i < out.size(); ++i) sent_plain[k][i] += out[i];

      // With residual feedback; the receiver accumulates straight into its sum.
      if (with_ef) {
        t0 = std::chrono::steady_clock::now();
        std::size_t const e_bytes = fed.compress(view, packet, ctx);
        t_ef += seconds_since(t0);
        fed.decompress_add(std::span<std::byte const>(packet.data(), e_bytes),
                           std::span<float>(sent_ef[k]), 1.0f, ctx);
      }
    }
    step_err += ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0;
  }

  auto run_error = [&](std::vector<std::vector<float>> const& sent) {
    double diff2 = 0, ref2 = 0;
    for (std::size_t k = 0; k < model.size(); ++k) add_error(sent[k], sum_g[k], diff2, ref2);
    return ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0;
  };
  double const in_bytes = 4.0 * static_cast<double>(total) * steps;
  result r;
  r.codec = entry;
  r.bytes_per_step = bytes / steps;
  r.ratio = in_bytes / bytes;
  r.step_err = step_err / steps;
  r.run_err_plain = run_error(sent_plain);
  if (with_ef) {
    r.run_err_ef = run_error(sent_ef);
    // Residual feedback promises that nothing is lost: what was sent plus what is still held
    // back equals what came in.
    for (std::size_t k = 0; k < model.size(); ++k) {
      std::span<float const> const e = fed.state(static_cast<gc::tensor_id>(k)).values();
      for (std::size_t i = 0; i < e.size(); ++i) sent_ef[k][i] += e[i];
    }
    r.conservation = run_error(sent_ef);
  }
  r.compress_gbs = in_bytes / t_comp / 1e9;
  r.decompress_gbs = in_bytes / t_decomp / 1e9;
  r.ef_compress_gbs = with_ef ? in_bytes / t_ef / 1e9 : 0.0;
  return r;
}

// Excess kurtosis and lag-1 correlation of the first two steps (printed with the model).
void describe_stream(std::vector<layer> const& model, std::uint64_t seed) {
  gradient_stream s(model, seed);
  std::vector<std::vector<float>> g0, g1;
  s.next(g0);
  s.next(g1);
  double kurt_sum = 0, kurt_w = 0, c01 = 0, c00 = 0, c11 = 0;
  for (std::size_t k = 0; k < model.size(); ++k) {
    double m2 = 0, m4 = 0, nz = 0;
    for (std::size_t i = 0; i < g0[k].size(); ++i) {
      double const a = g0[k][i], b = g1[k][i];
      c01 += a * b;
      c00 += a * a;
      c11 += b * b;
      if (a == 0.0) continue;
      m2 += a * a;
      m4 += a * a * a * a;
      ++nz;
    }
    if (nz > 0 && m2 > 0) {  // per-layer kurtosis, weighted by size (layers differ in scale)
      kurt_sum += (nz * m4 / (m2 * m2) - 3.0) * nz;
      kurt_w += nz;
    }
  }
  std::size_t total = 0, smallest = SIZE_MAX, largest = 0;
  float lo = 1e30f, hi = 0;
  for (layer const& l : model) {
    total += l.size();
    smallest = std::min(smallest, l.size());
    largest = std::max(largest, l.size());
    lo = std::min(lo, l.rms);
    hi = std::max(hi, l.rms);
  }
  std::printf(
      "gradient stream: transformer-like model, %zu tensors, %zu parameters (%.1f MB fp32);\n"
      "  tensors of %zu to %zu elements, nominal per-layer RMS %.0e to %.0e (jittered),\n"
      "  row-sparse embedding, excess kurtosis %.1f (per layer, size-weighted),\n"
      "  lag-1 correlation between steps %.2f\n",
      model.size(), total, 4e-6 * static_cast<double>(total), smallest, largest,
      static_cast<double>(lo), static_cast<double>(hi), kurt_w > 0 ? kurt_sum / kurt_w : 0.0,
      c01 / std::sqrt(c00 * c11));
}

std::string fmt_err(double e) {
  if (e < 0) return "—";
  char buf[32];
  if (e == 0) return "0";
  std::snprintf(buf, sizeof buf, e < 1e-3 || e >= 1e3 ? "%.2e" : "%.4f", e);
  return buf;
}

// Columns `s` takes on a terminal (UTF-8 aware: "±" and "—" are one column each).
std::size_t display_width(std::string const& s) {
  std::size_t shown = 0;
  for (char ch : s) shown += (static_cast<unsigned char>(ch) & 0xc0u) != 0x80u;
  return shown;
}

// `s` padded with spaces to `width` display columns, right-aligned unless `left`.
std::string pad(std::string s, std::size_t width, bool left = false) {
  std::size_t const shown = display_width(s);
  std::string const fill(shown < width ? width - shown : 0, ' ');
  return left ? s + fill : fill + s;
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void print_table(std::vector<result> const& rs) {
  std::size_t w = 22;  // the label column fits the longest label
  for (result const& r : rs) w = std::max(w, display_width(r.codec.label));
  std::printf("\n%s %11s %7s %10s %10s %10s %9s %9s %9s\n", pad("codec", w, true).c_str(),
              "bytes/step", "ratio", "step err", "run err", "run err", "compress", "decomp.",
              "EF comp.");
  std::printf("%s %11s %7s %10s %10s %10s %9s %9s %9s\n", pad("", w, true).c_str(), "", "vs fp32",
              "(no EF)", "(no EF)", "(EF)", "GB/s", "GB/s", "GB/s");
  for (result const& r : rs) {
    bool const ef = r.run_err_ef >= 0;
    std::printf("%s %s %s %s %s %s %s %s %s\n", pad(r.codec.label, w, true).c_str(),
                pad(fixed(r.bytes_per_step, 0), 11).c_str(), pad(fixed(r.ratio, 2), 7).c_str(),
                pad(fmt_err(r.step_err), 10).c_str(), pad(fmt_err(r.run_err_plain), 10).c_str(),
                pad(fmt_err(r.run_err_ef), 10).c_str(), pad(fixed(r.compress_gbs, 2), 9).c_str(),
                pad(fixed(r.decompress_gbs, 2), 9).c_str(),
                pad(ef ? fixed(r.ef_compress_gbs, 2) : "—", 9).c_str());
  }
}

bool write_csv(std::string const& path, std::vector<result> const& rs, std::size_t elements,
               int steps, unsigned threads) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  std::fprintf(f,
               "codec,spec,elements,steps,threads,bytes_per_step,ratio_vs_fp32,step_rel_err,"
               "run_rel_err_no_ef,run_rel_err_ef,compress_gbs,decompress_gbs,ef_compress_gbs\n");
  for (result const& r : rs) {
    std::fprintf(f, "\"%s\",\"%s\",%zu,%d,%u,%.0f,%.6g,%.6g,%.6g,", r.codec.label.c_str(),
                 r.codec.spec.c_str(), elements, steps, threads, r.bytes_per_step, r.ratio,
                 r.step_err, r.run_err_plain);
    if (r.run_err_ef >= 0) {
      std::fprintf(f, "%.6g,%.4g,%.4g,%.4g\n", r.run_err_ef, r.compress_gbs, r.decompress_gbs,
                   r.ef_compress_gbs);
    } else {
      std::fprintf(f, ",%.4g,%.4g,\n", r.compress_gbs, r.decompress_gbs);
    }
  }
  return std::fclose(f) == 0;
}

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: gradcomp_demo [--steps N] [--elements N] [--threads N] [--csv FILE] "
               "[--codec SPEC]...\n"
               "  --steps N      training steps to replay (default 20)\n"
               "  --elements N   approximate model size in parameters (default 2097152)\n"
               "  --threads N    threads of the codec pool (default: hardware concurrency)\n"
               "  --csv FILE     also write the table as CSV\n"
               "  --codec SPEC   run this gradcomp::make_codec spec (repeatable; default: all)\n");
}

bool parse_count(char const* s, unsigned long long& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(s, &end, 10);
  return end != s && *end == '\0' && errno == 0 && out > 0 && s[0] != '-';
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  std::size_t elements = std::size_t{1} << 21;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::string csv;
  std::vector<codec_entry> codecs;
  for (int i = 1; i < argc; ++i) {
    std::string_view const a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gradcomp_demo: %s needs a value\n", argv[i]);
      usage(stderr);
      return 2;
    }
    char const* v = argv[++i];
    unsigned long long n = 0;
    if (a == "--csv") {
      csv = v;
    } else if (a == "--codec") {
      codecs.push_back({v, v});
    } else if ((a == "--steps" || a == "--elements" || a == "--threads") && parse_count(v, n)) {
      if (a == "--steps") steps = static_cast<int>(std::min(n, 100000ull));
      if (a == "--elements") elements = static_cast<std::size_t>(std::max(n, 8192ull));
      if (a == "--threads") threads = static_cast<unsigned>(std::min(n, 1024ull));
    } else {
      std::fprintf(stderr, "gradcomp_demo: bad option %s %s\n", argv[i - 1], v);
      usage(stderr);
      return 2;
    }
  }
  if (codecs.empty()) codecs = default_codecs();
  for (codec_entry const& c : codecs) {  // reject a bad --codec before any work
    try {
      if (is_powersgd(c.spec)) {
        (void)gc::make_powersgd(c.spec);
      } else {
        (void)gc::make_codec(c.spec);
      }
    } catch (gc::error const& e) {
      std::fprintf(stderr, "gradcomp_demo: --codec %s: %s\n", c.spec.c_str(), e.what());
      return 2;
    }
  }

  std::uint64_t const seed = 2026;
  std::vector<layer> const model = make_model(elements);
  std::size_t total = 0;
  for (layer const& l : model) total += l.size();
  std::printf("gradcomp_demo: %d steps, %u thread(s), SIMD level %s\n", steps, threads,
              gc::cpu::isa_name(gc::cpu::machine_isa()));
  describe_stream(model, seed);

  gc::cpu::thread_pool pool(threads);
  std::vector<result> results;
  try {
    for (codec_entry const& c : codecs) {
      results.push_back(run_codec(c, model, steps, seed, pool));
    }
  } catch (gc::error const& e) {
    std::fprintf(stderr, "gradcomp_demo: %s\n", e.what());
    return 1;
  }
  print_table(results);
  double conservation = 0;
  for (result const& r : results) conservation = std::max(conservation, r.conservation);
  std::printf(
      "\n- step err: distortion of one step without feedback. run err: distance of the summed\n"
      "  decoded packets from the summed gradients after %d steps. With error feedback it is\n"
      "  the residual still held back, which for a contractive codec does not grow with the run.\n"
      "- Error feedback expects a contractive codec (step err < 1). Unbiased codecs whose step\n"
      "  err is above 1 (QSGD with few levels, TernGrad, L2-normalised dithering on 512-element\n"
      "  buckets) can make the residual grow: run them without feedback, with more levels, or\n"
      "  with smaller buckets.\n"
      "- Unscaled onebit sends +-1 (sign-SGD, majority vote): a learning rate scales it later, so\n"
      "  its errors against raw gradients are large by design.\n"
      "- Feedback conserves mass: sum of decoded packets + residual = sum of gradients, to a\n"
      "  relative %.1e here (float rounding; worst codec).\n",
      steps, conservation);
  if (!csv.empty()) {
    if (!write_csv(csv, results, total, steps, threads)) {
      std::fprintf(stderr, "gradcomp_demo: cannot write %s\n", csv.c_str());
      return 1;
    }
    std::printf("wrote %s\n", csv.c_str());
  }
  return 0;
}
