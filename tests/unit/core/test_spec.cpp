// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
// core/spec.hpp: the one `name:key=value,...` parser behind make_codec, make_controller and
// make_powersgd: grammar, conversions, consumption, and a config_error naming what is wrong.

#include <gradcomp/adapt/any_controller.hpp>
#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/core/spec.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gc = gradcomp;
using Catch::Matchers::Contains;

namespace {

std::string error_of(std::string const& spec) {
  try {
    gc::spec_options o(spec, "widget");
    (void)o.number("a", 0.0);
    (void)o.count("n", 0, 100);
    (void)o.choice("mode", {"fast", "slow"});
    o.finish({"a", "n", "mode"});
  } catch (gc::config_error const& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("spec parser: names, options in order, consumption", "[core][spec]") {
  gc::spec_options o("topk:ratio=0.5,values=f16,k=", "codec");
  CHECK(o.name() == "topk");
  CHECK(o.text() == "topk:ratio=0.5,values=f16,k=");
  CHECK(o.has("ratio"));
  CHECK(o.number("ratio", 1.0) == 0.5);
  CHECK_FALSE(o.has("ratio"));                  // consumed
  CHECK(o.number("ratio", 3.0) == 3.0);         // absent now: the default
  CHECK(o.take("k") == std::optional<std::string>(""));  // an empty value is a value
  CHECK(o.take("missing", "dflt") == "dflt");
  CHECK(o.take_all() == std::vector<std::pair<std::string, std::string>>{{"values", "f16"}});
  CHECK_NOTHROW(o.finish());

  gc::spec_options bare("identity", "codec");
  CHECK(bare.name() == "identity");
  CHECK_FALSE(bare.has("x"));
  CHECK_NOTHROW(bare.finish());

  gc::spec_options c("x:mode=slow,n=100", "widget");
  CHECK(c.choice("mode", {"fast", "slow"}) == 1);
  CHECK(c.choice("other", {"a", "b"}) == 0);  // absent: the first
  CHECK(c.count("n", 0, 100) == 100);
}

TEST_CASE("spec parser: bad input is a config_error naming the key and what is expected", "[core][spec]") {
  CHECK_THAT(error_of(""), Contains("widget spec '' has an empty name"));
  CHECK_THAT(error_of(":a=1"), Contains("has an empty name"));
  CHECK_THAT(error_of("w:"), Contains("widget spec 'w:' ends with ':'"));
  CHECK_THAT(error_of("w:a"), Contains("widget option 'a' is not key=value"));
  CHECK_THAT(error_of("w:=1"), Contains("option '=1' is not key=value"));
  CHECK_THAT(error_of("w:a=1,,n=2"), Contains("option '' is not key=value"));
  CHECK_THAT(error_of("w:a=1,a=2"), Contains("widget option 'a' given twice"));
  CHECK_THAT(error_of("w:b=1"), Contains("widget 'w' has no option 'b' (expected a, n, mode)"));
  CHECK_THAT(error_of("w:a=x"), Contains("widget option 'a' needs a number, got 'x'"));
  CHECK_THAT(error_of("w:a="), Contains("option 'a' needs a number, got ''"));
  CHECK_THAT(error_of("w:a=1.5e"), Contains("needs a number"));
  CHECK_THAT(error_of("w:n=-1"), Contains("widget option 'n' needs an unsigned integer of at most 100, got '-1'"));
  CHECK_THAT(error_of("w:n=1.5"), Contains("needs an unsigned integer"));
  CHECK_THAT(error_of("w:n=101"), Contains("at most 100, got '101'"));
  CHECK_THAT(error_of("w:mode=medium"), Contains("widget option 'mode' must be one of fast, slow, got 'medium'"));
  CHECK(error_of("w:a=2.5,n=7,mode=fast") == "no error");
}

TEST_CASE("spec parser: codecs, controllers and PowerSGD report the same errors", "[core][spec]") {
  // The message of the config_error that `build(spec)` throws, or "no error".
  auto error_from = [](auto build) {
    return [build](std::string const& spec) {
      try {
        (void)build(spec);
      } catch (gc::config_error const& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
  };
  auto const codec = error_from([](std::string const& s) { return gc::make_codec(s); });
  auto const controller = error_from([](std::string const& s) { return gc::make_controller(s); });
  auto const psgd = error_from([](std::string const& s) { return gc::make_powersgd(s); });
  for (auto const& [bad_, what] : std::vector<std::pair<std::string, std::string>>{
           {":x=1", "has an empty name"},
           {"NAME:x", "option 'x' is not key=value"},
           {"NAME:x=1,x=2", "option 'x' given twice"},
           {"NAME:", "ends with ':'"}}) {
    std::string const& bad = bad_;  // captured below (Clang 14 cannot capture a binding)
    auto sub = [&](std::string const& name) {
      std::string s = bad;
      if (auto p = s.find("NAME"); p != std::string::npos) s.replace(p, 4, name);
      return s;
    };
    CHECK_THAT(codec(sub("qsgd")), Contains("codec") && Contains(what));
    CHECK_THAT(controller(sub("gravac")), Contains("controller") && Contains(what));
    CHECK_THAT(psgd(sub("powersgd")), Contains("powersgd") && Contains(what));
  }
  CHECK_THAT(codec("qsgd:levels=x"), Contains("codec option 'levels' needs an unsigned integer"));
  CHECK_THAT(controller("gravac:epsilon=x"), Contains("controller option 'epsilon' needs a number"));
  CHECK_THAT(psgd("powersgd:rank=x"), Contains("powersgd option 'rank' needs an unsigned integer"));
  CHECK_THAT(codec("qsgd:nope=1"), Contains("codec 'qsgd' has no option 'nope'"));
  CHECK_THAT(controller("gravac:nope=1"), Contains("controller 'gravac' has no option 'nope'"));
  CHECK_THAT(psgd("powersgd:nope=1"), Contains("has no option 'nope' (expected rank, min_elements, backend)"));
  CHECK_THAT(psgd("powersgd:backend=gpu"), Contains("powersgd option 'backend' must be one of automatic, builtin, blas"));
}
