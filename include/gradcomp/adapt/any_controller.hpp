// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file
/// Run-time controller choice: `any_controller` (type erasure over any `controller`) and
/// `make_controller` (from a text spec such as
/// "gravac:theta_min=10,theta_max=1000,policy=exponential").

#include <gradcomp/adapt/accordion.hpp>
#include <gradcomp/adapt/gravac.hpp>
#include <gradcomp/adapt/protocol.hpp>
#include <gradcomp/adapt/schedule.hpp>
#include <gradcomp/concepts/controller.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/serialize.hpp>

#include <charconv>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <map>
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

namespace detail::controller_spec {

inline std::uint64_t to_u64(std::string_view key, std::string_view v) {
  std::uint64_t out = 0;
  auto const [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc{} || p != v.data() + v.size()) {
    throw config_error("gradcomp: controller option '" + std::string(key) +
                       "' needs an unsigned integer, got '" + std::string(v) + "'");
  }
  return out;
}

inline double to_double(std::string_view key, std::string_view v) {
  double out = 0.0;
  auto const [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc{} || p != v.data() + v.size()) {
    throw config_error("gradcomp: controller option '" + std::string(key) +
                       "' needs a number, got '" + std::string(v) + "'");
  }
  return out;
}

// The key=value options of a spec, each consumed once; leftovers are errors.
class options {
 public:
  options(std::string_view spec, std::string_view name) : name_(name) {
    auto const colon = spec.find(':');
    if (colon == std::string_view::npos) return;
    std::string_view rest = spec.substr(colon + 1);
    if (rest.empty()) {
      throw config_error("gradcomp: controller spec '" + std::string(spec) + "' ends with ':'");
    }
    while (true) {
      std::string_view const item = rest.substr(0, rest.find(','));
      bool const last = item.size() == rest.size();
      rest = last ? std::string_view{} : rest.substr(item.size() + 1);
      auto const eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        throw config_error("gradcomp: controller option '" + std::string(item) +
                           "' is not key=value");
      }
      std::string key(item.substr(0, eq));
      if (!opts_.emplace(key, std::string(item.substr(eq + 1))).second) {
        throw config_error("gradcomp: controller option '" + key + "' given twice");
      }
      order_.push_back(std::move(key));
      if (last) break;
    }
  }

  bool has(std::string_view key) const { return opts_.find(key) != opts_.end(); }
  double number(std::string_view key, double dflt) {
    auto it = opts_.find(key);
    if (it == opts_.end()) return dflt;
    double const v = to_double(key, it->second);
    opts_.erase(it);
    return v;
  }
  std::uint64_t count(std::string_view key, std::uint64_t dflt) {
    auto it = opts_.find(key);
    if (it == opts_.end()) return dflt;
    std::uint64_t const v = to_u64(key, it->second);
    opts_.erase(it);
    return v;
  }
  // The index of the value of `key` in `allowed` (default 0 when absent).
  unsigned choice(std::string_view key, std::initializer_list<std::string_view> allowed) {
    auto it = opts_.find(key);
    if (it == opts_.end()) return 0;
    unsigned i = 0;
    for (auto a : allowed) {
      if (it->second == a) {
        opts_.erase(it);
        return i;
      }
      ++i;
    }
    std::string list;
    for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    throw config_error("gradcomp: controller option '" + std::string(key) + "' must be one of " +
                       list + ", got '" + it->second + "'");
  }
  // Every remaining option, in the order given, then cleared.
  std::vector<std::pair<std::string, std::string>> take_all() {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto const& k : order_) {
      auto it = opts_.find(k);
      if (it != opts_.end()) out.emplace_back(it->first, it->second);
    }
    opts_.clear();
    return out;
  }
  void finish() const {
    if (!opts_.empty()) {
      throw config_error("gradcomp: controller '" + name_ + "' has no option '" +
                         opts_.begin()->first + "'");
    }
  }

 private:
  std::string name_;
  std::map<std::string, std::string, std::less<>> opts_;
  std::vector<std::string> order_;
};

}  // namespace detail::controller_spec

/// Builds a controller from a spec `name[:key=value[,key=value...]]`:
/// - `dense` (static factor 1), `static:factor=100`;
/// - `schedule:0=4,1000=16,5000=1000` (keys are start steps, values factors);
/// - `dgc_warmup:stage_steps=100,final=1000,stages=4,base=4` (`stage_steps` required);
/// - `gravac:theta_min=10,theta_max=1000,epsilon=0.7,omega=0.01,window=500,
///   policy=exponential|geometric,step_factor=2,ratio=2,smoothing=0,gain=ratio|separate,
///   throughput=window_mean|last,base=initial|current,dense=flush|keep`;
/// - `accordion:low=1.0101,high=10,eta=0.5,interval=1000,accumulation=100,
///   scope=any_layer|whole_model`.
/// Omitted options take the defaults of the config structs. Unknown names, keys or values
/// and invalid parameters raise `config_error`.
inline any_controller make_controller(std::string_view spec) {
  std::string_view const name = spec.substr(0, spec.find(':'));
  detail::controller_spec::options o(spec, name);
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
      points.push_back({detail::controller_spec::to_u64("start step", k),
                        detail::controller_spec::to_double(k, v)});
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
  throw config_error("gradcomp: unknown controller '" + std::string(name) +
                     "' (expected dense, static, schedule, dgc_warmup, gravac or accordion)");
}

GRADCOMP_NAMESPACE_END
