// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Run-time controller choice: `any_controller` (type erasure over any `controller`) and
/// `make_controller` (from a text spec such as
/// "gravac:theta_min=10,theta_max=1000,policy=exponential").

#include <gradcomp/adapt/accordion.hpp>
#include <gradcomp/adapt/ef_window.hpp>
#include <gradcomp/adapt/gravac.hpp>
#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/adapt/schedule.hpp>
#include <gradcomp/concepts/controller.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>
#include <gradcomp/core/spec.hpp>

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN

/// A controller chosen at run time. A value type: copying copies the controller's state.
/// Models `controller`.
class any_controller {
 public:
  using controller_concept = controller_tag;

  /// Wraps controller `c`; `name` is what `name()` returns (e.g. the spec it was made from).
  template <controller C>
    requires(!std::same_as<C, any_controller>)
  any_controller(C c, std::string name = "custom")  // NOLINT(implicit)
      : impl_(std::make_unique<model<C>>(std::move(c))), name_(std::move(name)) {}

  any_controller(any_controller const& o) : impl_(o.impl_->clone()), name_(o.name_) {}
  any_controller(any_controller&&) noexcept = default;
  any_controller& operator=(any_controller const& o) {
    if (this != &o) *this = any_controller(o);
    return *this;
  }
  any_controller& operator=(any_controller&&) noexcept = default;
  ~any_controller() = default;

  [[nodiscard]] step_plan const& plan() const noexcept { return impl_->plan(); }
  decision decide(step_stats const& s) { return impl_->decide(s); }
  [[nodiscard]] std::string const& name() const noexcept { return name_; }

  /// The controller's whole state ("GCCT" version 1: the controller's kind, then its
  /// `save_state` record). A controller without `save_state` is a `config_error`.
  [[nodiscard]] std::vector<std::byte> save() const {
    detail::byte_writer w;
    w.begin("GCCT", 1);
    w.put_string(impl_->kind());
    impl_->save_state(w);
    return w.finish();
  }
  /// Restores a state written by `save` of a controller of the same kind and configuration;
  /// `format_error` otherwise, and the state is unchanged.
  void load(std::span<std::byte const> in) {
    detail::byte_reader r(in, "GCCT", 1, "controller state");
    if (r.get_string() != impl_->kind()) r.fail("saved by another kind of controller");
    std::unique_ptr<interface> fresh = impl_->clone();
    fresh->load_state(r);
    r.expect_end();
    impl_ = std::move(fresh);
  }

  /// The wrapped controller if it is a `C`, else null.
  template <class C>
  [[nodiscard]] C const* target() const noexcept {
    return impl_->type() == typeid(C) ? &static_cast<model<C> const*>(impl_.get())->c_ : nullptr;
  }

 private:
  struct interface {
    virtual ~interface() = default;
    virtual std::unique_ptr<interface> clone() const = 0;
    virtual step_plan const& plan() const noexcept = 0;
    virtual decision decide(step_stats const&) = 0;
    virtual std::type_info const& type() const noexcept = 0;
    virtual std::string kind() const = 0;
    virtual void save_state(detail::byte_writer&) const = 0;
    virtual void load_state(detail::byte_reader&) = 0;
  };

  template <class C>
  struct model final : interface {
    explicit model(C c) : c_(std::move(c)) {}
    std::unique_ptr<interface> clone() const override { return std::make_unique<model>(c_); }
    step_plan const& plan() const noexcept override { return c_.plan(); }
    decision decide(step_stats const& s) override { return c_.decide(s); }
    std::type_info const& type() const noexcept override { return typeid(C); }
    std::string kind() const override {
      if constexpr (requires { C::state_kind; }) return C::state_kind;
      else return "custom";
    }
    void save_state(detail::byte_writer& w) const override {
      if constexpr (requires { c_.save_state(w); }) {
        c_.save_state(w);
      } else {
        throw config_error("gradcomp: this controller type has no save_state; its state cannot be saved");
      }
    }
    void load_state(detail::byte_reader& r) override {
      if constexpr (requires { c_.load_state(r); }) {
        c_.load_state(r);
      } else {
        throw config_error("gradcomp: this controller type has no load_state; its state cannot be restored");
      }
    }
    C c_;
  };

  std::unique_ptr<interface> impl_;
  std::string name_;
};

static_assert(controller<any_controller>);

/// Builds a controller from a spec `name[:key=value[,key=value...]]`:
/// - `dense` (static factor 1), `static:factor=100`;
/// - `schedule:0=4,1000=16,5000=1000` (keys are start steps, values factors);
/// - `dgc_warmup:stage_steps=100,final=1000,stages=4,base=4` (`stage_steps` required);
/// - `gravac:theta_min=10,theta_max=1000,epsilon=0.7,omega=0.01,window=500,
///   policy=exponential|geometric,step_factor=2,ratio=2,smoothing=0,gain=ratio|separate,
///   throughput=window_mean|last,base=initial|current,dense=flush|keep`;
/// - `accordion:low=1.0101,high=10,eta=0.5,interval=1000,accumulation=100,
///   scope=any_layer|whole_model`;
/// - `ef_window:min=10,max=1000,ratio=2,window=40,max_delay=20,settled=0.75,climb=4,start=0,
///   loss_block=10,loss_rise=0.25` (`loss_block=0`: no loss check).
/// Omitted options take the defaults of the config structs. Unknown names, keys or values
/// and invalid parameters raise `config_error` (grammar and messages: `spec_options`,
/// core/spec.hpp).
inline any_controller make_controller(std::string_view spec) {
  spec_options o(spec, "controller");
  std::string const& name = o.name();
  std::string const label(spec);
  if (name == "dense") {
    o.finish();
    return any_controller(static_controller(1.0), label);
  }
  if (name == "static") {
    if (!o.has("factor")) throw config_error("gradcomp: controller 'static' needs factor=");
    double const f = o.number("factor", 1.0);
    o.finish();
    return any_controller(static_controller(f), label);
  }
  if (name == "schedule") {
    std::vector<schedule_point> points;
    for (auto const& [k, v] : o.take_all()) {
      points.push_back({o.to_count("start step", k), o.to_number(k, v)});
    }
    return any_controller(schedule_controller(std::move(points)), label);
  }
  if (name == "dgc_warmup") {
    if (!o.has("stage_steps")) {
      throw config_error("gradcomp: controller 'dgc_warmup' needs stage_steps=");
    }
    std::uint64_t const steps = o.count("stage_steps", 0);
    double const fin = o.number("final", 1000.0);
    std::uint64_t const stages = o.count("stages", 4);
    double const base = o.number("base", 4.0);
    o.finish();
    if (stages > 64) {
      throw config_error("gradcomp: controller 'dgc_warmup' allows at most 64 stages, got " +
                         std::to_string(stages));
    }
    return any_controller(dgc_warmup(steps, fin, static_cast<std::uint32_t>(stages), base), label);
  }
  if (name == "gravac") {
    gravac_config c;
    c.theta_min = o.number("theta_min", c.theta_min);
    c.theta_max = o.number("theta_max", c.theta_max);
    c.epsilon = o.number("epsilon", c.epsilon);
    c.omega = o.number("omega", c.omega);
    c.window = o.count("window", c.window);
    c.policy = static_cast<gravac_policy>(o.choice("policy", {"exponential", "geometric"}));
    c.step_factor = o.number("step_factor", c.step_factor);
    c.ratio = o.number("ratio", c.ratio);
    c.smoothing = o.number("smoothing", c.smoothing);
    c.gain_average = static_cast<gravac_gain_average>(o.choice("gain", {"ratio", "separate"}));
    c.throughput = static_cast<gravac_throughput>(o.choice("throughput", {"window_mean", "last"}));
    c.candidate_base = static_cast<gravac_base>(o.choice("base", {"initial", "current"}));
    c.dense_fallback = static_cast<gravac_dense>(o.choice("dense", {"flush", "keep"}));
    o.finish();
    return any_controller(gravac_controller(c), label);
  }
  if (name == "accordion") {
    accordion_config c;
    c.low_factor = o.number("low", c.low_factor);
    c.high_factor = o.number("high", c.high_factor);
    c.eta = o.number("eta", c.eta);
    c.interval = o.count("interval", c.interval);
    c.accumulation = o.count("accumulation", c.accumulation);
    c.scope = static_cast<accordion_scope>(o.choice("scope", {"any_layer", "whole_model"}));
    o.finish();
    return any_controller(accordion_controller(c), label);
  }
  if (name == "ef_window") {
    ef_window_config c;
    c.factor_min = o.number("min", c.factor_min);
    c.factor_max = o.number("max", c.factor_max);
    c.ratio = o.number("ratio", c.ratio);
    c.window = o.count("window", c.window);
    c.max_delay = o.number("max_delay", c.max_delay);
    c.settled = o.number("settled", c.settled);
    c.climb = o.number("climb", c.climb);
    c.start = o.number("start", c.start);
    c.loss_block = o.count("loss_block", c.loss_block);
    c.loss_rise = o.number("loss_rise", c.loss_rise);
    o.finish();
    return any_controller(ef_window_controller(c), label);
  }
  throw config_error("gradcomp: unknown controller '" + std::string(name) +
                     "' (expected dense, static, schedule, dgc_warmup, gravac, accordion or ef_window)");
}

/// The controller types `make_controller` builds, one `X(type)` each (see
/// GRADCOMP_DETAIL_MAKE_CODEC_TYPES, codec/any_codec.hpp).
#define GRADCOMP_DETAIL_MAKE_CONTROLLER_TYPES(X) \
  X(static_controller) X(schedule_controller) X(gravac_controller) X(accordion_controller) X(ef_window_controller)

#if GRADCOMP_EXTERN_TEMPLATES
#  define GRADCOMP_DETAIL_EXTERN_CONTROLLER_MODEL(C) extern template struct any_controller::model<C>;
GRADCOMP_DETAIL_MAKE_CONTROLLER_TYPES(GRADCOMP_DETAIL_EXTERN_CONTROLLER_MODEL)
#  undef GRADCOMP_DETAIL_EXTERN_CONTROLLER_MODEL
#endif

GRADCOMP_NAMESPACE_END
