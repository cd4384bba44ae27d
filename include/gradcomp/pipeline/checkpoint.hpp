// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// The "GCPL" checkpoint of a `gradient_pipeline` (`save` / `load`, pipeline/pipeline.hpp;
/// docs/pipeline.md, "Checkpoints"): its format constants, its sections in their order, and the
/// checks of its frame, configuration and layer accumulators. What each section holds is the
/// business of its owner (the error-feedback compressor, the controller, the guard, the
/// exchange mode); this header writes and reads the container around them.
///
/// Format, version 2, in the frame of core/serialize.hpp (magic, version, body length, CRC32C
/// trailer of all bytes):
///
/// 1. the configuration: codec, feedback and controller specs (strings), the two-way flag (u64);
/// 2. the step counter (u64) and the last step's timing: backprop, compress, sync (f64 each);
/// 3. error feedback: one byte string, `compressor::save` ("GCEF") of the pipeline's
///    compressor, of the hierarchical shard owners', or a device source's in that format;
/// 4. controller: one byte string, `any_controller::save` ("GCCT"), empty without a controller;
/// 5. layer accumulators: their count (u64), then per tensor in ascending id its id (u64) and
///    its values (float array);
/// 6. PowerSGD sessions (pipeline/low_rank_mode.hpp) and 7. two-way state
///    (pipeline/two_way_mode.hpp), written and read by the mode, each empty in another mode;
/// 8. divergence guard: one byte string, `divergence_guard::save` ("GCGD").
///
/// `detail::checkpoint_writer` writes the sections in this order and `detail::checkpoint_reader`
/// hands them out in it (calling either out of order is a `std::logic_error`). The reader
/// refuses a malformed frame, a checksum mismatch, a checkpoint of another configuration and an
/// accumulator id that appears twice with a `format_error` (the byte reader's, naming a
/// "gradient_pipeline checkpoint"); the sections' owners check their own bytes.

#include <gradcomp/concepts/step_protocol.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// The configuration a checkpoint is saved with, and which the loading pipeline must have.
struct checkpoint_config {
  std::string codec;
  std::string feedback;
  std::string controller;
  bool two_way = false;
};

namespace detail {

/// The magic and version of the pipeline's checkpoint.
inline constexpr char const* pipeline_checkpoint_magic = "GCPL";
inline constexpr std::uint8_t pipeline_checkpoint_version = 2;

/// The sections of a checkpoint after its head, in their order (file comment).
enum class checkpoint_section : std::uint8_t {
  feedback,
  controller,
  accumulators,
  mode,
  guard,
  end
};

/// Enforces the order of the sections: `next(s)` must name the section after the previous one.
class checkpoint_order {
 public:
  void next(checkpoint_section s) {
    if (s != next_) throw std::logic_error("gradcomp: checkpoint sections out of order");
    next_ = static_cast<checkpoint_section>(static_cast<std::uint8_t>(s) + 1);
  }

 private:
  checkpoint_section next_ = checkpoint_section::feedback;
};

/// Writes a checkpoint (file comment): the head at construction, then one call per section.
class checkpoint_writer {
 public:
  /// Opens the checkpoint of a pipeline configured with `c` after `step` steps, the last one
  /// taking `timing`.
  checkpoint_writer(checkpoint_config const& c, std::uint64_t step, step_timing const& timing) {
    w_.begin(pipeline_checkpoint_magic, pipeline_checkpoint_version);
    w_.put_string(c.codec);
    w_.put_string(c.feedback);
    w_.put_string(c.controller);
    w_.put_u64(c.two_way ? 1 : 0);
    w_.put_u64(step);
    w_.put_f64(timing.backprop);
    w_.put_f64(timing.compress);
    w_.put_f64(timing.sync);
  }

  /// Section 3: the error feedback's saved state.
  void feedback(std::span<std::byte const> state) {
    order_.next(checkpoint_section::feedback);
    w_.put_bytes(state);
  }
  /// Section 4: the controller's saved state (empty: none).
  void controller(std::span<std::byte const> state) {
    order_.next(checkpoint_section::controller);
    w_.put_bytes(state);
  }
  /// Section 5: the layer accumulators.
  void accumulators(std::map<tensor_id, std::vector<float>> const& acc) {
    order_.next(checkpoint_section::accumulators);
    w_.put_u64(acc.size());
    for (auto const& [id, values] : acc) {
      w_.put_u64(static_cast<std::uint64_t>(id));
      w_.put_floats(values);
    }
  }
  /// Sections 6 and 7: the writer the mode writes its PowerSGD and two-way sections to.
  [[nodiscard]] byte_writer& mode_sections() {
    order_.next(checkpoint_section::mode);
    return w_;
  }
  /// Section 8: the divergence guard's saved state.
  void guard(std::span<std::byte const> state) {
    order_.next(checkpoint_section::guard);
    w_.put_bytes(state);
  }
  /// The checkpoint, with its checksum.
  [[nodiscard]] std::vector<std::byte> finish() {
    order_.next(checkpoint_section::end);
    return w_.finish();
  }

 private:
  byte_writer w_;
  checkpoint_order order_;
};

/// Reads a checkpoint (file comment): the frame and head at construction, then one call per
/// section; `fail` throws the `format_error` of this checkpoint.
class checkpoint_reader {
 public:
  /// Checks the frame and the configuration against `mine` (a `format_error` naming what
  /// differs), then reads the step counter and timing.
  checkpoint_reader(std::span<std::byte const> bytes, checkpoint_config const& mine)
      : r_(bytes, pipeline_checkpoint_magic, pipeline_checkpoint_version,
           "gradient_pipeline checkpoint") {
    expect(r_.get_string(), mine.codec, "codec");
    expect(r_.get_string(), mine.feedback, "feedback");
    expect(r_.get_string(), mine.controller, "controller");
    if (r_.get_u64() != (mine.two_way ? 1u : 0u)) r_.fail("saved with another two_way setting");
    step_ = r_.get_u64();
    timing_.backprop = r_.get_f64();
    timing_.compress = r_.get_f64();
    timing_.sync = r_.get_f64();
  }

  /// The step counter saved.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  /// The last step's timing saved.
  [[nodiscard]] step_timing const& timing() const noexcept { return timing_; }

  /// Section 3: the error feedback's saved state.
  [[nodiscard]] std::vector<std::byte> feedback() {
    order_.next(checkpoint_section::feedback);
    return r_.get_bytes();
  }
  /// Section 4: the controller's saved state (empty: none).
  [[nodiscard]] std::vector<std::byte> controller() {
    order_.next(checkpoint_section::controller);
    return r_.get_bytes();
  }
  /// Section 5: the layer accumulators; `fail` for an id that appears twice.
  [[nodiscard]] std::map<tensor_id, std::vector<float>> accumulators() {
    order_.next(checkpoint_section::accumulators);
    std::map<tensor_id, std::vector<float>> acc;
    std::uint64_t const count = r_.get_u64();
    for (std::uint64_t i = 0; i < count; ++i) {
      auto const id = static_cast<tensor_id>(r_.get_u32_of_u64("accumulator id"));
      if (!acc.emplace(id, r_.get_floats()).second) r_.fail("an accumulator id appears twice");
    }
    return acc;
  }
  /// Sections 6 and 7: the reader the mode reads its PowerSGD and two-way sections from.
  [[nodiscard]] byte_reader& mode_sections() {
    order_.next(checkpoint_section::mode);
    return r_;
  }
  /// Section 8: the divergence guard's saved state.
  [[nodiscard]] std::vector<std::byte> guard() {
    order_.next(checkpoint_section::guard);
    return r_.get_bytes();
  }
  /// The end: `fail` for trailing bytes.
  void end() {
    order_.next(checkpoint_section::end);
    r_.expect_end();
  }

  /// Throws the `format_error` of this checkpoint, saying `why`.
  [[noreturn]] void fail(std::string const& why) const { r_.fail(why); }

 private:
  void expect(std::string const& got, std::string const& mine, char const* what) const {
    if (got != mine) {
      r_.fail(std::string("saved with ") + what + " '" + got + "', this pipeline has '" + mine +
              "'");
    }
  }

  byte_reader r_;
  checkpoint_order order_;
  std::uint64_t step_ = 0;
  step_timing timing_;
};

}  // namespace detail

GRADCOMP_NAMESPACE_END
