// SPDX-FileCopyrightText: 2026 The gradcomp authors
// SPDX-License-Identifier: Apache-2.0
//
// gradcomp._C: the C++ half of the Python package (python/gradcomp/). What it binds:
//   - the errors, as Python exceptions with the library's messages;
//   - `Codec`: compress a CPU tensor into a uint8 tensor, decompress (or add) a packet into a
//     tensor, for every codec spec of `make_codec` and for PowerSGD (`make_powersgd`); a CUDA
//     tensor into a CUDA uint8 tensor on torch's current stream of its device, through the
//     library's CUDA codecs (cuda_codec.hpp), where the extension has its CUDA part
//     (GRADCOMP_PYTHON_CUDA, python/CMakeLists.txt);
//   - `decompress`, `inspect`: any packet, stateless;
//   - `Engine`: the DDP hook's engine (ddp_engine.hpp) over a torch.distributed process group;
//   - `Communicator`: the library's collectives over a process group, for tests and for users
//     who exchange tensors themselves;
//   - `CalibratedOnebitAdamGroup`: the library's calibrated 1-bit Adam over a process group
//     (gradcomp.OneBitAdam), in the optimizers section at the end of the anonymous namespace.
//   - `LocalUpdate`: the DiLoCo-family sync step (optim/local_update.hpp) over a `Communicator`,
//     on float32 CPU tensors; python/gradcomp/diloco.py wraps it for a model.

#include "cuda_codec.hpp"
#include "ddp_engine.hpp"

#include <gradcomp/codec/any_codec.hpp>
#include <gradcomp/codec/codec_spec.hpp>
#include <gradcomp/codec/powersgd.hpp>
#include <gradcomp/collective/all_reduce.hpp>
#include <gradcomp/comm/c10d.hpp>
#include <gradcomp/comm/in_process.hpp>
#include <gradcomp/core/wire.hpp>
#include <gradcomp/optim/calibrated_onebit_adam.hpp>
#include <gradcomp/optim/local_update.hpp>
#include <gradcomp/pipeline/pipeline.hpp>
#include <gradcomp/version.hpp>

#include <torch/extension.h>

#ifndef GRADCOMP_PYTHON_CUDA
#  define GRADCOMP_PYTHON_CUDA 0  // python/CMakeLists.txt defines it to 1 with the CUDA part
#endif
#if GRADCOMP_PYTHON_CUDA
#  include <c10/cuda/CUDAGuard.h>
#  include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace py = pybind11;
namespace gc = gradcomp;
using namespace gradcomp_python;

namespace {

// The Python exception types of the library's errors (made once, in the module's init).
struct error_types {
  PyObject* error = nullptr;
  PyObject* config = nullptr;
  PyObject* format = nullptr;
  PyObject* numeric = nullptr;
  PyObject* comm = nullptr;
};
error_types errors;

// The Python exception for a C++ one: the library's errors as their kinds, anything else as
// gradcomp.Error with its message. Needs the GIL.
py::object python_exception(std::exception_ptr const& e) {
  PyObject* type = errors.error;
  std::string what = "gradcomp: unknown error";
  try {
    std::rethrow_exception(e);
  } catch (gc::config_error const& x) {
    type = errors.config, what = x.what();
  } catch (gc::format_error const& x) {
    type = errors.format, what = x.what();
  } catch (gc::numeric_error const& x) {
    type = errors.numeric, what = x.what();
  } catch (gc::comm_error const& x) {
    type = errors.comm, what = x.what();
  } catch (std::exception const& x) {
    what = x.what();
  } catch (...) {
  }
  return py::reinterpret_borrow<py::object>(type)(what);
}

// A Python object held from C++ threads: dropped with the GIL.
std::shared_ptr<py::object> hold(py::object o) {
  return {new py::object(std::move(o)), [](py::object* p) {
            py::gil_scoped_acquire gil;
            delete p;
          }};
}

// The torch.futures.Future DDP waits for, completed when the engine's future completes: with
// the bucket, or with the step's error as the library's Python exception. Made in Python so
// that the extension needs none of torch's JIT binding internals (pybind_utils.h), whose
// symbols libtorch_python does not export in every release.
py::object python_future(future_ptr const& f) {
  py::object fut = py::module_::import("torch.futures").attr("Future")();
  auto held = hold(fut);
  f->addCallback([held](c10::ivalue::Future& done) {
    py::gil_scoped_acquire gil;
    try {
      if (done.hasError()) held->attr("set_exception")(python_exception(done.exception_ptr()));
      else held->attr("set_result")(py::cast(done.value().toTensor()));
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("gradcomp: completing a DDP hook future");
    }
  });
  return fut;
}

// Whether this build of the extension has its CUDA part.
constexpr bool has_cuda_part = GRADCOMP_PYTHON_CUDA != 0;

// What a tensor on a device the codec API does not take gets told.
[[noreturn]] void refuse_device(at::Tensor const& t, char const* what) {
  if (t.device().is_cuda() && has_cuda_part) {
    throw gc::config_error(std::string("gradcomp: ") + what + " is on " + t.device().str() +
                           "; only Codec(spec).compress / decompress / decompress_add take CUDA tensors "
                           "(gradcomp.decompress, gradcomp.inspect and Communicator take CPU tensors)");
  }
  if (t.device().is_cuda()) {
    throw gc::config_error(std::string("gradcomp: ") + what + " is on " + t.device().str() +
                           ", and this build of the gradcomp package has no CUDA part (it was built against a "
                           "CPU-only torch, without nvcc, or with GRADCOMP_PYTHON_CUDA=OFF: docs/pytorch.md, "
                           "\"CUDA tensors\"); rebuild it where nvcc and a CUDA build of torch are, or pass a CPU tensor");
  }
  throw gc::config_error(std::string("gradcomp: ") + what + " must be a CPU tensor" +
                         (has_cuda_part ? " (Codec(spec) takes CUDA tensors too)" : "") + ", got one on " +
                         t.device().str());
}

// A contiguous tensor of float32 / float16 / bfloat16 (checked), for the codec API: on the CPU,
// or with `cuda` on a CUDA device too.
void check_values(at::Tensor const& t, char const* what, bool cuda = false) {
  if (!t.device().is_cpu() && !(cuda && has_cuda_part && t.device().is_cuda())) refuse_device(t, what);
  if (!t.is_contiguous()) throw gc::config_error(std::string("gradcomp: ") + what + " must be contiguous");
  auto const st = t.scalar_type();
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) {
    throw gc::config_error(std::string("gradcomp: ") + what + " must be float32, float16 or bfloat16, got " +
                           std::string(c10::toString(st)));
  }
}

value_type value_type_of(at::Tensor const& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return value_type::f16;
    case at::kBFloat16: return value_type::bf16;
    default: return value_type::f32;
  }
}

std::span<std::byte const> packet_bytes(at::Tensor const& p) {
  if (!p.device().is_cpu()) {
    if (p.device().is_cuda() && has_cuda_part) {
      throw gc::config_error("gradcomp: this packet is on " + p.device().str() +
                             "; a packet on a CUDA device is decoded by Codec(spec).decompress into a tensor on the "
                             "same device (gradcomp.decompress and gradcomp.inspect read CPU packets)");
    }
    refuse_device(p, "the packet");
  }
  if (!p.is_contiguous() || p.scalar_type() != at::kByte || p.dim() != 1) {
    throw gc::config_error("gradcomp: a packet must be a contiguous 1-D uint8 CPU tensor");
  }
  return {reinterpret_cast<std::byte const*>(p.data_ptr()), static_cast<std::size_t>(p.numel())};
}

template <class F>
decltype(auto) with_span(at::Tensor const& t, F&& f) {
  auto const n = static_cast<std::size_t>(t.numel());
  switch (t.scalar_type()) {
    case at::kHalf: return f(std::span<gc::half>(reinterpret_cast<gc::half*>(t.data_ptr()), n));
    case at::kBFloat16: return f(std::span<gc::bfloat16>(reinterpret_cast<gc::bfloat16*>(t.data_ptr()), n));
    default: return f(std::span<float>(reinterpret_cast<float*>(t.data_ptr()), n));
  }
}


// The float32 CPU tensors of a `LocalUpdate` call as spans (checked: contiguous float32 on the CPU).
std::vector<std::span<float>> weight_spans(std::vector<at::Tensor> const& ts) {
  std::vector<std::span<float>> out;
  out.reserve(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    at::Tensor const& t = ts[i];
    if (!t.device().is_cpu() || !t.is_contiguous() || t.scalar_type() != at::kFloat) {
      throw gc::config_error("gradcomp: LocalUpdate: tensor " + std::to_string(i) +
                             " must be a contiguous float32 CPU tensor, got " + std::string(c10::toString(t.scalar_type())) +
                             " on " + t.device().str() + (t.is_contiguous() ? "" : " (not contiguous)"));
    }
    out.emplace_back(reinterpret_cast<float*>(t.data_ptr()), static_cast<std::size_t>(t.numel()));
  }
  return out;
}

py::dict local_update_stats_dict(gc::local_update_stats const& st) {
  py::dict d;
  d["step"] = st.step;
  d["synced"] = st.synced;
  d["fragments"] = st.fragments;
  d["tensors"] = st.tensors;
  d["elements"] = st.elements;
  d["applied"] = st.applied;
  d["packet_bytes"] = st.packet_bytes;
  d["wire_bytes"] = st.wire_bytes;
  return d;
}

gc::local_update_options local_update_options_from(py::dict const& o) {
  gc::local_update_options opt;
  for (auto const& [k, v] : o) {
    std::string const key = py::cast<std::string>(k);
    if (key == "outer") opt.outer = py::cast<std::string>(v);
    else if (key == "outer_lr") { if (!v.is_none()) opt.outer_lr = py::cast<double>(v); }
    else if (key == "outer_momentum") { if (!v.is_none()) opt.outer_momentum = py::cast<double>(v); }
    else if (key == "sync_every") opt.sync_every = py::cast<std::uint64_t>(v);
    else if (key == "fragments") opt.fragments = py::cast<std::uint64_t>(v);
    else if (key == "overlap") opt.overlap = py::cast<std::uint64_t>(v);
    else if (key == "mix") opt.mix = py::cast<double>(v);
    else if (key == "codec") opt.codec = py::cast<std::string>(v);
    else if (key == "feedback") opt.feedback = v.is_none() ? std::string("none") : py::cast<std::string>(v);
    else if (key == "seed") opt.seed = py::cast<std::uint64_t>(v);
    else if (key == "checksum") opt.checksum = py::cast<bool>(v);
    else throw gc::config_error("gradcomp: LocalUpdate: unknown option '" + key + "'");
  }
  return opt;
}

gc::codec_context context(std::uint64_t seed, std::uint32_t step) {
  gc::codec_context ctx;
  ctx.seed = seed;
  ctx.step = step;
  return ctx;
}

// The Python `Codec`: a stateless codec, or PowerSGD (stateful per tensor id, shaped).
class py_codec {
 public:
  explicit py_codec(std::string spec) : spec_(std::move(spec)) {
    gc::codec_spec parsed = gc::make_codec_spec(spec_);  // what the spec names, decided in codec/
    if (auto const* o = std::get_if<gc::powersgd_options>(&parsed)) psgd_.emplace(*o);
    else codec_.emplace(std::get<gc::any_codec>(std::move(parsed)));
  }

  [[nodiscard]] std::string const& spec() const noexcept { return spec_; }
  [[nodiscard]] std::string name() const { return psgd_ ? "powersgd" : codec_->name(); }
  [[nodiscard]] std::string aggregation() const {
    return psgd_ ? "low_rank" : gc::aggregation_name(codec_->aggregation());
  }

  // Rows × cols PowerSGD gives `t`: its first dimension by the rest (a 1-D tensor: 1 × n).
  static std::pair<std::size_t, std::size_t> matrix_shape(at::Tensor const& t) {
    if (t.dim() <= 1) return {1, static_cast<std::size_t>(t.numel())};
    auto const rows = static_cast<std::size_t>(t.size(0));
    return {rows, rows == 0 ? 0 : static_cast<std::size_t>(t.numel()) / rows};
  }

  [[nodiscard]] std::size_t max_compressed_bytes(at::Tensor const& t) const {
    if (psgd_) {
      auto [r, c] = matrix_shape(t);
      return psgd_->max_compressed_bytes(r, c);
    }
    return codec_->max_compressed_bytes(static_cast<std::size_t>(t.numel()));
  }

  at::Tensor compress(at::Tensor const& t, std::optional<at::Tensor> out, std::uint64_t seed, std::uint32_t step,
                      std::uint32_t id) {
#if GRADCOMP_PYTHON_CUDA
    if (t.device().is_cuda()) return compress_on_device(t, std::move(out), device_call{seed, step, id, nullptr});
#endif
    check_values(t, "the tensor to compress");
    std::size_t const cap = max_compressed_bytes(t);
    at::Tensor buf;
    if (out) {
      buf = *out;
      if (!buf.device().is_cpu() || !buf.is_contiguous() || buf.scalar_type() != at::kByte) {
        throw gc::config_error("gradcomp: out must be a contiguous uint8 CPU tensor");
      }
      if (static_cast<std::size_t>(buf.numel()) < cap) {
        throw gc::config_error("gradcomp: out has " + std::to_string(buf.numel()) + " bytes, the packet may need " +
                               std::to_string(cap));
      }
    } else {
      buf = at::empty({static_cast<std::int64_t>(cap)}, at::TensorOptions().dtype(at::kByte));
    }
    std::span<std::byte> dst(reinterpret_cast<std::byte*>(buf.data_ptr()), static_cast<std::size_t>(buf.numel()));
    auto const ctx = context(seed, step);
    std::size_t n = 0;
    {
      py::gil_scoped_release nogil;
      with_span(t, [&](auto s) {
        using T = typename decltype(s)::element_type;
        gc::tensor_view<T const> v(std::span<T const>(s), static_cast<gc::tensor_id>(id));
        if (psgd_) {
          auto [r, c] = matrix_shape(t);
          n = psgd_->compress(v, r, c, dst, ctx);
        } else {
          n = codec_->compress(v, dst, ctx);
        }
        return 0;
      });
    }
    return buf.narrow(0, 0, static_cast<std::int64_t>(n));
  }

  void decompress(at::Tensor const& packet, at::Tensor& out, bool add, float alpha, std::uint64_t seed,
                  std::uint32_t step) {
#if GRADCOMP_PYTHON_CUDA
    if (out.device().is_cuda() || packet.device().is_cuda()) {
      decompress_on_device(packet, out, add, alpha, device_call{seed, step, 0, nullptr});
      return;
    }
#endif
    check_values(out, "the output tensor");
    auto const p = packet_bytes(packet);
    auto const ctx = context(seed, step);
    py::gil_scoped_release nogil;
    with_span(out, [&](auto s) {
      if (psgd_) {
        if (add) gc::powersgd::decompress_add(p, s, alpha, ctx);
        else gc::powersgd::decompress(p, s, ctx);
      } else if (add) {
        codec_->decompress_add(p, s, alpha, ctx);
      } else {
        codec_->decompress(p, s, ctx);
      }
      return 0;
    });
  }

 private:
#if GRADCOMP_PYTHON_CUDA
  // The CUDA codec of the spec, made at the first use on a CUDA tensor (a spec the CUDA part
  // does not carry is refused then, not when the Codec is made). Needs the GIL.
  device_codec const& on_device() {
    if (psgd_) {
      throw gc::config_error("gradcomp: Codec('" + spec_ +
                             "'): PowerSGD compresses CPU tensors only; on CUDA tensors Codec takes " +
                             device_codec_names());
    }
    if (!device_) device_ = device_codec::make(spec_);
    return *device_;
  }

  // torch's current stream of `d` (what the caller's kernels are ordered on), as a cudaStream_t.
  static void* current_stream(c10::Device d) { return c10::cuda::getCurrentCUDAStream(d.index()).stream(); }

  at::Tensor compress_on_device(at::Tensor const& t, std::optional<at::Tensor> out, device_call call) {
    check_values(t, "the tensor to compress", true);
    device_codec const& dev = on_device();
    auto const n = static_cast<std::size_t>(t.numel());
    std::size_t const cap = dev.max_compressed_bytes(n);
    at::Tensor buf;
    if (out) {
      buf = *out;
      if (buf.device() != t.device() || !buf.is_contiguous() || buf.scalar_type() != at::kByte) {
        throw gc::config_error("gradcomp: out must be a contiguous uint8 tensor on " + t.device().str() +
                               ", the tensor's device");
      }
      if (static_cast<std::size_t>(buf.numel()) < cap) {
        throw gc::config_error("gradcomp: out has " + std::to_string(buf.numel()) + " bytes, the packet may need " +
                               std::to_string(cap));
      }
    } else {
      buf = at::empty({static_cast<std::int64_t>(cap)}, t.options().dtype(at::kByte));
    }
    c10::cuda::CUDAGuard const guard(t.device());
    call.stream = current_stream(t.device());
    std::size_t size = 0;
    {
      py::gil_scoped_release nogil;
      size = dev.compress(value_type_of(t), t.data_ptr(), n, reinterpret_cast<std::byte*>(buf.data_ptr()),
                          static_cast<std::size_t>(buf.numel()), call);
    }
    return buf.narrow(0, 0, static_cast<std::int64_t>(size));
  }

  void decompress_on_device(at::Tensor const& packet, at::Tensor& out, bool add, float alpha, device_call call) {
    check_values(out, "the output tensor", true);
    if (packet.device() != out.device()) {
      throw gc::config_error("gradcomp: the packet is on " + packet.device().str() + " and the output tensor on " +
                             out.device().str() + "; decode into a tensor on the packet's device");
    }
    if (!packet.is_contiguous() || packet.scalar_type() != at::kByte || packet.dim() != 1) {
      throw gc::config_error("gradcomp: a packet must be a contiguous 1-D uint8 tensor");
    }
    device_codec const& dev = on_device();
    c10::cuda::CUDAGuard const guard(out.device());
    call.stream = current_stream(out.device());
    py::gil_scoped_release nogil;
    dev.decompress(reinterpret_cast<std::byte const*>(packet.data_ptr()), static_cast<std::size_t>(packet.numel()),
                   value_type_of(out), out.data_ptr(), static_cast<std::size_t>(out.numel()), add, alpha, call);
  }

  std::unique_ptr<device_codec> device_;
#endif
  std::string spec_;
  std::optional<gc::any_codec> codec_;
  std::optional<gc::powersgd> psgd_;
};

py::dict stats_dict(gc::pipeline_stats const& s) {
  py::dict d;
  d["step"] = s.step;
  d["sent"] = s.sent == gc::send_kind::dense ? "dense" : (s.sent == gc::send_kind::candidate ? "candidate" : "minimum");
  d["factor"] = s.factor;
  d["gain"] = s.gain;
  d["bytes_sent"] = s.bytes_sent;
  d["wire_bytes"] = s.wire_bytes;
  d["tensors"] = s.tensors;
  d["compressed_tensors"] = s.compressed_tensors;
  d["messages"] = s.buckets;
  d["compress_s"] = s.compress_s;
  d["communicate_s"] = s.communicate_s;
  d["decode_s"] = s.decode_s;
  d["total_s"] = s.total_s;
  d["guard"] = s.guard == gc::guard_action::skipped
                   ? "skipped"
                   : (s.guard == gc::guard_action::dense ? "dense" : "none");
  d["gradient_norm"] = s.gradient_norm;
  d["residual_norm"] = s.residual_norm;
  d["loss"] = s.loss;
  return d;
}

// The options of the DDP hook's engine. Their names, types and defaults are one table,
// gradcomp/_options.py (OPTIONS); the binding reads it: each option is converted with the type
// the table gives it (a value of another type is a ConfigError naming the option and the type
// it takes), an option not given takes the table's default, and a name the table does not
// have is a ConfigError. `set_option` is where each name lands in `engine_options`;
// `engine_defaults` reports what the C++ structs hold by default, which a test compares with
// the table.
using option_value = std::variant<std::string, bool, std::uint64_t, double>;

// The table (a tuple of (name, type, default, doc) tuples).
py::object option_table() { return py::module_::import("gradcomp._options").attr("OPTIONS"); }

option_value option_from(std::string const& name, std::string const& type, py::handle v) {
  auto wrong = [&](char const* expected) -> option_value {
    std::string const got = py::str(py::type::of(v).attr("__name__"));
    std::string const repr = py::repr(v);
    throw gc::config_error("gradcomp: option '" + name + "' must be " + expected + ", got " + got + " " + repr);
  };
  bool const is_bool = PyBool_Check(v.ptr()) != 0;
  if (type == "str") {
    if (!PyUnicode_Check(v.ptr())) return wrong("a string");
    return py::cast<std::string>(v);
  }
  if (type == "bool") {
    if (!is_bool) return wrong("a bool (True or False)");
    return v.ptr() == Py_True;
  }
  if (type == "int") {
    if (is_bool || PyIndex_Check(v.ptr()) == 0) return wrong("a non-negative int");
    py::int_ const i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
    if (!i) throw py::error_already_set();
    if (i < py::int_(0)) return wrong("a non-negative int");
    unsigned long long const u = PyLong_AsUnsignedLongLong(i.ptr());
    if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      return wrong("a non-negative int below 2**64");
    }
    return static_cast<std::uint64_t>(u);
  }
  if (type == "float") {
    if (is_bool || (PyFloat_Check(v.ptr()) == 0 && PyLong_Check(v.ptr()) == 0)) return wrong("a number (int or float)");
    double const d = PyFloat_AsDouble(v.ptr());
    if (d == -1.0 && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      return wrong("a number that fits a double");
    }
    return d;
  }
  throw gc::config_error("gradcomp: option '" + name + "' has type '" + type + "' in gradcomp/_options.py, which the binding does not know");
}

// Writes one option (converted by `option_from`) into `e`.
void set_option(engine_options& e, std::string const& name, option_value const& v) {
  auto as_int = [&](std::uint64_t max) {
    std::uint64_t const u = std::get<std::uint64_t>(v);
    if (u > max) throw gc::config_error("gradcomp: option '" + name + "' must be at most " + std::to_string(max) + ", got " + std::to_string(u));
    return u;
  };
  auto& p = e.pipeline;
  if (name == "codec") p.codec = std::get<std::string>(v);
  else if (name == "feedback") p.feedback = std::get<std::string>(v);
  else if (name == "controller") p.controller = std::get<std::string>(v);
  else if (name == "guard") p.guard = std::get<std::string>(v);
  else if (name == "two_way") p.two_way = std::get<bool>(v);
  else if (name == "seed") p.seed = std::get<std::uint64_t>(v);
  else if (name == "measure_gain") p.measure_gain = std::get<bool>(v);
  else if (name == "measured_timing") p.measured_timing = std::get<bool>(v);
  else if (name == "min_compress_elements") p.buckets.min_compress_elements = static_cast<std::size_t>(as_int(SIZE_MAX));
  else if (name == "bucket_mb") {
    // The hook hands the pipeline every parameter's gradient; the pipeline groups their packets
    // into messages of up to bucket_mb MiB of gradient (DDP's default bucket size by default).
    double const mb = std::get<double>(v);
    if (!(mb > 0) || !(mb < 1e12)) throw gc::config_error("gradcomp: option 'bucket_mb' must be positive (and below 1e12)");
    p.buckets.bucket_bytes = static_cast<std::size_t>(mb * 1024.0 * 1024.0);
  } else if (name == "start_iter") e.start_iter = static_cast<std::int64_t>(as_int(INT64_MAX));
  else if (name == "batch_size") e.batch_size = std::get<std::uint64_t>(v);
  else if (name == "log_every") e.log_every = static_cast<std::int64_t>(as_int(INT64_MAX));
  else if (name == "timeout_s") {
    double const s = std::get<double>(v);
    if (!(s > 0) || !(s < 1e9)) throw gc::config_error("gradcomp: option 'timeout_s' must be positive (and below 1e9)");
    e.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000.0));
  } else {
    throw gc::config_error("gradcomp: option '" + name + "' of gradcomp/_options.py has no place in the engine's options");
  }
}

// The engine's options from a dict of the table's options (see above).
engine_options engine_options_from(py::dict const& o) {
  engine_options e;
  std::vector<std::string> known;
  for (py::handle row : option_table()) {
    auto const name = py::cast<std::string>(row.attr("name"));
    auto const type = py::cast<std::string>(row.attr("type"));
    py::object const value = o.contains(name) ? py::object(o[name.c_str()]) : py::object(row.attr("default"));
    set_option(e, name, option_from(name, type, value));
    known.push_back(name);
  }
  std::string unknown;
  for (auto const& [k, v] : o) {
    std::string const key = py::isinstance<py::str>(k) ? py::cast<std::string>(k) : std::string(py::repr(k));
    if (std::find(known.begin(), known.end(), key) == known.end()) unknown += (unknown.empty() ? "" : ", ") + key;
  }
  if (!unknown.empty()) throw gc::config_error("gradcomp: unknown options: " + unknown);
  return e;
}

// What the engine's C++ structs hold by default, under the table's names (compared with the
// table by tests/python/test_options.py).
py::dict engine_defaults() {
  engine_options const e{};
  auto const& p = e.pipeline;
  py::dict d;
  d["codec"] = p.codec;
  d["feedback"] = p.feedback;
  d["controller"] = p.controller;
  d["guard"] = p.guard;
  d["two_way"] = p.two_way;
  d["seed"] = p.seed;
  d["start_iter"] = e.start_iter;
  d["batch_size"] = e.batch_size;
  d["measure_gain"] = p.measure_gain;
  d["measured_timing"] = p.measured_timing;
  d["min_compress_elements"] = p.buckets.min_compress_elements;
  d["bucket_mb"] = static_cast<double>(p.buckets.bucket_bytes) / (1024.0 * 1024.0);
  d["log_every"] = e.log_every;
  d["timeout_s"] = std::chrono::duration<double>(e.timeout).count();
  return d;
}

// Destroys an engine without the GIL: its worker thread may be waiting for the GIL to drop the
// last reference to a future's Python value, and joining it while holding the GIL deadlocks.
struct engine_deleter {
  void operator()(ddp_engine* e) const {
    if (PyGILState_Check() != 0) {
      py::gil_scoped_release nogil;
      delete e;
    } else {
      delete e;
    }
  }
};

// ============================================================================================
// Optimizers (issue 33): the library's calibrated 1-bit Adam (optim/calibrated_onebit_adam.hpp)
// over a process group, for gradcomp.OneBitAdam (python/gradcomp/onebit_adam.py). One C++
// optimizer per parameter (its rows: the parameter's first dimension, 0 for a vector), tensor
// id = the parameter's index, every step over gc::c10d_communicator.
// ============================================================================================

using calibrated_adam = gc::calibrated_onebit_adam<gc::any_codec>;

// The options of calibrated_onebit_adam (and its adam_options) by their C++ names.
py::dict calibrated_adam_defaults() {
  gc::calibrated_onebit_adam_options const o{};
  py::dict d;
  d["codec"] = std::string("onebit");
  d["lr"] = o.adam.lr;
  d["beta1"] = o.adam.beta1;
  d["beta2"] = o.adam.beta2;
  d["eps"] = o.adam.eps;
  d["weight_decay"] = o.adam.weight_decay;
  d["decay"] = std::string(o.adam.decay == gc::weight_decay_mode::decoupled ? "decoupled" : "l2");
  d["sync_first"] = o.sync_first;
  d["sync_every"] = o.sync_every;
  d["sketch"] = o.sketch;
  d["sketch_first"] = o.sketch_first;
  d["seed"] = o.seed;
  return d;
}

// The C++ options of a dict holding every name of calibrated_adam_defaults (checked by the
// caller), for a parameter of `rows` rows; config_error naming the first invalid one.
gc::calibrated_onebit_adam_options calibrated_adam_options(py::dict const& d, std::size_t rows) {
  gc::calibrated_onebit_adam_options o;
  o.adam.lr = py::cast<double>(d["lr"]);
  o.adam.beta1 = py::cast<double>(d["beta1"]);
  o.adam.beta2 = py::cast<double>(d["beta2"]);
  o.adam.eps = py::cast<double>(d["eps"]);
  o.adam.weight_decay = py::cast<double>(d["weight_decay"]);
  std::string const decay = py::cast<std::string>(d["decay"]);
  if (decay == "l2") o.adam.decay = gc::weight_decay_mode::l2;
  else if (decay == "decoupled") o.adam.decay = gc::weight_decay_mode::decoupled;
  else throw gc::config_error("gradcomp: OneBitAdam decay must be 'l2' or 'decoupled', got '" + decay + "'");
  o.rows = rows;
  o.sync_first = py::cast<std::uint64_t>(d["sync_first"]);
  o.sync_every = py::cast<std::uint64_t>(d["sync_every"]);
  o.sketch = py::cast<std::size_t>(d["sketch"]);
  o.sketch_first = py::cast<std::size_t>(d["sketch_first"]);
  o.seed = py::cast<std::uint64_t>(d["seed"]);
  return o;
}

// A contiguous float32 CPU tensor as a span (checked; `what` names it in the error).
std::span<float> float32_span(at::Tensor const& t, std::string const& what) {
  if (!t.device().is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous()) {
    throw gc::config_error("gradcomp: OneBitAdam takes contiguous float32 CPU tensors; " + what + " is " +
                           std::string(c10::toString(t.scalar_type())) + " on " + t.device().str() +
                           (t.is_contiguous() ? "" : ", not contiguous"));
  }
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

// The optimizers of a model's parameters over one process group (gradcomp.OneBitAdam's engine).
class calibrated_adam_group {
 public:
  calibrated_adam_group(c10::intrusive_ptr<::c10d::ProcessGroup> pg, double timeout_s)
      : comm_(std::move(pg),
              gc::c10d_options{std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000))}) {}

  // Adds the optimizer of parameter `index` (the next one): `options` by the C++ names.
  void add(std::string const& codec, py::dict const& options, std::size_t rows) {
    gc::calibrated_onebit_adam_options const o = calibrated_adam_options(options, rows);
    opts_.emplace_back(gc::make_codec(codec), o);
  }

  [[nodiscard]] std::size_t size() const noexcept { return opts_.size(); }
  [[nodiscard]] int rank() const noexcept { return comm_.rank(); }
  [[nodiscard]] int world() const noexcept { return comm_.size(); }

  // One step of every parameter, in index order, each with its group's lr. Checked before
  // anything changes, on every rank alike: the sizes (config_error) and finite gradients on
  // every rank (one all-reduce of a flag; numeric_error). Returns the bytes of the step.
  py::dict step(std::vector<at::Tensor> const& params, std::vector<at::Tensor> const& grads,
                std::vector<double> const& lrs) {
    std::size_t const n = opts_.size();
    if (params.size() != n || grads.size() != n || lrs.size() != n) {
      throw gc::config_error("gradcomp: OneBitAdam.step needs one parameter, gradient and lr per optimizer (" +
                             std::to_string(n) + ")");
    }
    std::vector<std::span<float>> xs(n);
    std::vector<std::span<float const>> gs(n);
    for (std::size_t i = 0; i < n; ++i) {
      xs[i] = float32_span(params[i], "parameter " + std::to_string(i));
      gs[i] = float32_span(grads[i], "the gradient of parameter " + std::to_string(i));
      if (gs[i].size() != xs[i].size()) {
        throw gc::config_error("gradcomp: OneBitAdam: the gradient of parameter " + std::to_string(i) + " has " +
                               std::to_string(gs[i].size()) + " elements, the parameter " +
                               std::to_string(xs[i].size()));
      }
      auto const m = opts_[i].local_momentum();
      if (!m.empty() && m.size() != xs[i].size()) {
        throw gc::config_error("gradcomp: OneBitAdam: parameter " + std::to_string(i) + " has " +
                               std::to_string(xs[i].size()) + " elements, " + std::to_string(m.size()) +
                               " at the earlier steps");
      }
      if (!(std::isfinite(lrs[i]) && lrs[i] >= 0.0)) {
        throw gc::config_error("gradcomp: OneBitAdam lr must be finite and >= 0, got " + std::to_string(lrs[i]));
      }
    }
    py::dict out;
    std::size_t packet = 0, wire = 0, elements = 0;
    {
      py::gil_scoped_release nogil;
      std::uint8_t bad = 0;
      for (std::size_t i = 0; i < n && bad == 0; ++i) {
        for (float v : gs[i]) {
          if (!std::isfinite(v)) {
            bad = 1;
            break;
          }
        }
      }
      std::uint8_t any = bad;
      comm_.all_reduce(std::as_writable_bytes(std::span<std::uint8_t>(&any, 1)), gc::comm_type::u8,
                       gc::reduce_op::max);
      if (any != 0) {
        throw gc::numeric_error(bad != 0 ? "gradcomp: OneBitAdam: a gradient of this rank is not finite; the step "
                                           "changed nothing on any rank"
                                         : "gradcomp: OneBitAdam: a gradient of another rank is not finite; the "
                                           "step changed nothing on any rank");
      }
      for (std::size_t i = 0; i < n; ++i) {
        opts_[i].set_lr(lrs[i]);
        gc::codec_context ctx;
        ctx.seed = opts_[i].options().seed;
        ctx.step = static_cast<std::uint32_t>(opts_[i].steps());
        gc::collective_result const r = opts_[i].step(
            comm_, xs[i], gc::tensor_view<float const>(gs[i], static_cast<gc::tensor_id>(i)), ctx);
        packet += r.packet_bytes;
        wire += r.wire_bytes;
        elements += xs[i].size();
      }
    }
    out["packet_bytes"] = packet;
    out["wire_bytes"] = wire;
    out["dense_bytes"] = 4 * elements;
    out["steps"] = n == 0 ? std::uint64_t{0} : opts_[0].steps();
    return out;
  }

  [[nodiscard]] py::bytes save(std::size_t i) const {
    auto const b = at(i).save();
    return py::bytes(reinterpret_cast<char const*>(b.data()), b.size());
  }
  void load(std::size_t i, py::bytes const& b) {
    std::string const s = b;
    at(i).load(std::span<std::byte const>(reinterpret_cast<std::byte const*>(s.data()), s.size()));
  }
  [[nodiscard]] std::uint64_t steps(std::size_t i) const { return at(i).steps(); }
  [[nodiscard]] double calibration(std::size_t i) const { return at(i).calibration(static_cast<std::size_t>(world())); }

 private:
  calibrated_adam& at(std::size_t i) {
    if (i >= opts_.size()) throw gc::config_error("gradcomp: OneBitAdam has no parameter " + std::to_string(i));
    return opts_[i];
  }
  calibrated_adam const& at(std::size_t i) const { return const_cast<calibrated_adam_group*>(this)->at(i); }

  gc::c10d_communicator comm_;
  std::vector<calibrated_adam> opts_;
};

// The C++ optimizer driven directly, without torch: `world` ranks as threads over the library's
// in-process communicator, each parameter's `steps` gradients per rank given (grads[rank][step][i]),
// from the parameters `x0`. Returns, per rank, the parameters after the steps and the bytes of
// each step. For tests (tests/python/test_onebit_adam.py compares gradcomp.OneBitAdam with it).
py::list drive_calibrated_adam(std::string const& codec, py::dict const& options, std::vector<std::size_t> rows,
                               std::vector<std::vector<float>> const& x0,
                               std::vector<std::vector<std::vector<std::vector<float>>>> const& grads,
                               std::vector<double> const& lrs) {
  std::size_t const world = grads.size();
  std::size_t const n = x0.size();
  if (world == 0 || rows.size() != n) throw gc::config_error("gradcomp: drive_calibrated_adam: bad shapes");
  std::vector<gc::calibrated_onebit_adam_options> opts;
  for (std::size_t i = 0; i < n; ++i) opts.push_back(calibrated_adam_options(options, rows[i]));
  std::vector<std::vector<std::vector<float>>> xs(world, x0);
  std::vector<std::vector<std::size_t>> bytes(world);
  {
    py::gil_scoped_release nogil;
    gc::run_in_process(static_cast<int>(world), [&](gc::in_process_communicator& comm) {
      auto const r = static_cast<std::size_t>(comm.rank());
      std::vector<calibrated_adam> o;
      for (std::size_t i = 0; i < n; ++i) o.emplace_back(gc::make_codec(codec), opts[i]);
      for (std::size_t s = 0; s < grads[r].size(); ++s) {
        std::size_t b = 0;
        for (std::size_t i = 0; i < n; ++i) {
          if (s < lrs.size()) o[i].set_lr(lrs[s]);
          gc::codec_context ctx;
          ctx.seed = opts[i].seed;
          ctx.step = static_cast<std::uint32_t>(o[i].steps());
          b += o[i].step(comm, std::span<float>(xs[r][i]),
                         gc::tensor_view<float const>(std::span<float const>(grads[r][s][i]),
                                                      static_cast<gc::tensor_id>(i)),
                         ctx)
                   .packet_bytes;
        }
        bytes[r].push_back(b);
      }
    });
  }
  py::list out;
  for (std::size_t r = 0; r < world; ++r) out.append(py::make_tuple(xs[r], bytes[r]));
  return out;
}

void bind_optimizers(py::module_& m) {
  m.def("calibrated_onebit_adam_defaults", &calibrated_adam_defaults,
        "The defaults of calibrated_onebit_adam_options (and its adam_options), by their C++ names.");
  m.def(
      "check_calibrated_onebit_adam",
      [](std::string const& codec, py::dict const& options) {
        calibrated_adam const probe(gc::make_codec(codec), calibrated_adam_options(options, 0));
        (void)probe;
      },
      py::arg("codec"), py::arg("options"),
      "Raises ConfigError naming the first invalid option (the C++ constructor's checks).");
  m.def("_drive_calibrated_onebit_adam", &drive_calibrated_adam, py::arg("codec"), py::arg("options"),
        py::arg("rows"), py::arg("x0"), py::arg("grads"), py::arg("lrs"));
  py::class_<calibrated_adam_group>(m, "CalibratedOnebitAdamGroup")
      .def(py::init<c10::intrusive_ptr<::c10d::ProcessGroup>, double>(), py::arg("process_group"),
           py::arg("timeout_s") = 300.0)
      .def("add", &calibrated_adam_group::add, py::arg("codec"), py::arg("options"), py::arg("rows"))
      .def("step", &calibrated_adam_group::step, py::arg("params"), py::arg("grads"), py::arg("lrs"))
      .def("save", &calibrated_adam_group::save, py::arg("index"))
      .def("load", &calibrated_adam_group::load, py::arg("index"), py::arg("state"))
      .def("steps", &calibrated_adam_group::steps, py::arg("index"))
      .def("calibration", &calibrated_adam_group::calibration, py::arg("index"))
      .def_property_readonly("size", &calibrated_adam_group::size)
      .def_property_readonly("rank", &calibrated_adam_group::rank)
      .def_property_readonly("world", &calibrated_adam_group::world);
}
// ======================== end of the optimizers section (issue 33) ==========================

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gradcomp: gradient compression for distributed training (C++ core)";
  m.attr("__version__") = std::to_string(GRADCOMP_VERSION_MAJOR) + "." + std::to_string(GRADCOMP_VERSION_MINOR) + "." +
                          std::to_string(GRADCOMP_VERSION_PATCH);

  // Exceptions: gradcomp.Error (a RuntimeError) and its kinds, with the library's messages.
  // The types live as long as the module (one reference each, never dropped).
  auto new_error = [&](char const* name, PyObject* base) {
    std::string const qualified = std::string("gradcomp._C.") + name;
    PyObject* t = PyErr_NewException(qualified.c_str(), base, nullptr);
    if (t == nullptr) throw py::error_already_set();
    m.add_object(name, py::handle(t));
    return t;
  };
  errors.error = new_error("Error", PyExc_RuntimeError);
  errors.config = new_error("ConfigError", errors.error);
  errors.format = new_error("FormatError", errors.error);
  errors.numeric = new_error("NumericError", errors.error);
  errors.comm = new_error("CommError", errors.error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (gc::config_error const& e) {
      PyErr_SetString(errors.config, e.what());
    } catch (gc::format_error const& e) {
      PyErr_SetString(errors.format, e.what());
    } catch (gc::numeric_error const& e) {
      PyErr_SetString(errors.numeric, e.what());
    } catch (gc::comm_error const& e) {
      PyErr_SetString(errors.comm, e.what());
    } catch (gc::error const& e) {
      PyErr_SetString(errors.error, e.what());
    }
  });

  // The CUDA part: whether it was compiled, and the codecs it carries ("" without it).
  m.attr("has_cuda") = has_cuda_part;
#if GRADCOMP_PYTHON_CUDA
  m.attr("cuda_codecs") = device_codec_names();
#else
  m.attr("cuda_codecs") = std::string();
#endif

  py::class_<py_codec>(m, "Codec",
                       "A codec from a spec (see docs/pytorch.md): compress / decompress CPU tensors, and CUDA "
                       "tensors where the package has its CUDA part (gradcomp.has_cuda).")
      .def(py::init<std::string>(), py::arg("spec"))
      .def_property_readonly("spec", &py_codec::spec)
      .def_property_readonly("name", &py_codec::name)
      .def_property_readonly("aggregation", &py_codec::aggregation)
      .def("max_compressed_bytes", &py_codec::max_compressed_bytes, py::arg("tensor"))
      .def("compress", &py_codec::compress, py::arg("tensor"), py::arg("out") = py::none(), py::arg("seed") = 0,
           py::arg("step") = 0, py::arg("id") = 0,
           "Compresses a contiguous CPU or CUDA tensor (float32/float16/bfloat16) into a uint8 tensor on its device (a "
           "view of `out` when given); CUDA tensors on torch's current stream.")
      .def(
          "decompress",
          [](py_codec& c, at::Tensor const& packet, at::Tensor out, std::uint64_t seed, std::uint32_t step) {
            c.decompress(packet, out, false, 1.0f, seed, step);
            return out;
          },
          py::arg("packet"), py::arg("out"), py::arg("seed") = 0, py::arg("step") = 0,
          "Decodes a packet into `out` (overwritten) and returns it.")
      .def(
          "decompress_add",
          [](py_codec& c, at::Tensor const& packet, at::Tensor out, float alpha, std::uint64_t seed,
             std::uint32_t step) {
            c.decompress(packet, out, true, alpha, seed, step);
            return out;
          },
          py::arg("packet"), py::arg("out"), py::arg("alpha") = 1.0f, py::arg("seed") = 0, py::arg("step") = 0,
          "Adds alpha times the decoded packet to `out` and returns it.")
      .def("__repr__", [](py_codec const& c) { return "gradcomp.Codec('" + c.spec() + "')"; });

  m.def(
      "decompress",
      [](at::Tensor const& packet, at::Tensor out, bool add, float alpha, std::uint64_t seed, std::uint32_t step) {
        check_values(out, "the output tensor");
        auto const p = packet_bytes(packet);
        auto const ctx = context(seed, step);
        py::gil_scoped_release nogil;
        with_span(out, [&](auto s) {
          gc::decompress_any(p, s, alpha, add, ctx);
          return 0;
        });
        return out;
      },
      py::arg("packet"), py::arg("out"), py::arg("add") = false, py::arg("alpha") = 1.0f, py::arg("seed") = 0,
      py::arg("step") = 0, "Decodes a packet of any codec into `out` (or adds it, with add=True).");

  m.def(
      "inspect",
      [](at::Tensor const& packet) {
        auto const h = gc::read_header(packet_bytes(packet));
        py::dict d;
        d["codec"] = gc::codec_name(h.codec);
        d["dtype"] = std::string(gc::dtype_name(h.type));
        d["variant"] = h.variant;
        d["count"] = h.count;
        d["payload_bytes"] = h.payload_bytes;
        d["packet_bytes"] = h.packet_bytes();
        return d;
      },
      py::arg("packet"), "The header of a packet (validated).");

  m.def("engine_defaults", &engine_defaults,
        "The defaults of the DDP hook engine's C++ options, by the names of gradcomp/_options.py.");

  py::class_<ddp_engine, std::unique_ptr<ddp_engine, engine_deleter>>(m, "Engine")
      .def(py::init([](c10::intrusive_ptr<::c10d::ProcessGroup> pg, py::dict o) {
             return std::unique_ptr<ddp_engine, engine_deleter>(new ddp_engine(std::move(pg), engine_options_from(o)));
           }),
           py::arg("process_group"), py::arg("options"))
      .def(
          "submit",
          [](ddp_engine& e, std::int64_t index, at::Tensor buffer, py::list views, py::list shapes,
             py::list keys, bool is_last) {
            if (!buffer.device().is_cpu()) {
              throw gc::config_error(
                  "gradcomp: the DDP hook compresses CPU buckets; this bucket is on " + buffer.device().str() +
                  ". On CUDA buckets this release runs none of the hook's options (codec, feedback, controller, "
                  "guard, two_way, PowerSGD, start_iter, state_dict): docs/pytorch.md, \"CUDA tensors\". Train "
                  "the model on the CPU (gloo), or use PyTorch's own hooks for CUDA buckets; gradcomp.Codec "
                  "compresses CUDA tensors for an exchange of your own");
            }
            std::vector<piece> pieces;
            if (views.empty()) {
              pieces.push_back(piece{buffer, 0, 0});
            } else {
              for (std::size_t i = 0; i < views.size(); ++i) {
                piece p;
                p.view = py::cast<at::Tensor>(views[i]);
                if (i < keys.size()) p.key = py::cast<std::int64_t>(keys[i]);
                if (p.view.scalar_type() != buffer.scalar_type() || !p.view.is_contiguous() || p.view.dim() != 1) {
                  throw gc::config_error("gradcomp: a bucket piece must be a contiguous 1-D view of the bucket's dtype");
                }
                if (i < shapes.size()) {
                  auto rc = py::cast<std::pair<std::int64_t, std::int64_t>>(shapes[i]);
                  p.rows = rc.first;
                  p.cols = rc.second;
                }
                pieces.push_back(std::move(p));
              }
            }
            future_ptr f;
            {
              py::gil_scoped_release nogil;
              f = e.submit(index, std::move(buffer), std::move(pieces), is_last);
            }
            return python_future(f);
          },
          py::arg("index"), py::arg("buffer"), py::arg("views"), py::arg("shapes"), py::arg("keys"),
          py::arg("is_last"))
      .def("wait_idle", &ddp_engine::wait_idle, py::call_guard<py::gil_scoped_release>())
      .def("save",
           [](ddp_engine& e) {
             std::vector<std::byte> b;
             {
               py::gil_scoped_release nogil;
               b = e.save();
             }
             return py::bytes(reinterpret_cast<char const*>(b.data()), b.size());
           })
      .def("load",
           [](ddp_engine& e, py::bytes const& b) {
             std::string const s = b;
             py::gil_scoped_release nogil;
             e.load(std::span<std::byte const>(reinterpret_cast<std::byte const*>(s.data()), s.size()));
           })
      .def("last_stats", [](ddp_engine& e) { return stats_dict(e.last_stats()); })
      .def("report_loss", &ddp_engine::report_loss)
      .def("totals",
           [](ddp_engine& e) {
             auto const t = e.totals();
             py::dict d;
             d["iterations"] = t.iterations;
             d["bytes_sent"] = t.bytes_sent;
             d["hook_s"] = t.hook_s;
             d["layout_changes"] = t.layout_changes;
             return d;
           })
      .def_property_readonly("iteration", &ddp_engine::iteration)
      .def_property_readonly("rank", &ddp_engine::rank)
      .def_property_readonly("size", &ddp_engine::size)
      .def("tensor_ids", &ddp_engine::tensor_ids, py::call_guard<py::gil_scoped_release>())
      .def("feedback_state", &ddp_engine::feedback_state, py::call_guard<py::gil_scoped_release>());

  // The library's collectives over a process group (tests; users who exchange themselves).
  py::class_<gc::c10d_communicator>(m, "Communicator")
      .def(py::init([](c10::intrusive_ptr<::c10d::ProcessGroup> pg, double timeout_s) {
             return gc::c10d_communicator(std::move(pg),
                                          gc::c10d_options{std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000))});
           }),
           py::arg("process_group"), py::arg("timeout_s") = 300.0)
      // Anything else, a backend object in particular (torch 2.x: ProcessGroupGloo and
      // ProcessGroupNCCL are Backends behind a ProcessGroup), is a ConfigError saying so.
      .def(py::init([](py::object const& other, double) -> gc::c10d_communicator {
             std::string const type = py::str(py::type::of(other).attr("__name__"));
             bool const backend = py::isinstance(other, py::module_::import("torch._C._distributed_c10d").attr("Backend"));
             if (backend) {
               throw gc::config_error("gradcomp: got a " + type +
                                      ", a torch.distributed backend object; pass the process group it belongs "
                                      "to instead (dist.group.WORLD, dist.new_group(...))");
             }
             throw gc::config_error("gradcomp: process_group must be a torch.distributed.ProcessGroup, got " + type);
           }),
           py::arg("process_group"), py::arg("timeout_s") = 300.0)
      .def_property_readonly("rank", &gc::c10d_communicator::rank)
      .def_property_readonly("size", &gc::c10d_communicator::size)
      .def(
          "all_reduce_compressed",
          [](gc::c10d_communicator& c, std::string const& spec, at::Tensor t, std::uint64_t seed) {
            check_values(t, "the tensor");
            gc::any_codec const codec = gc::make_codec(spec);
            py::gil_scoped_release nogil;
            with_span(t, [&](auto s) {
              using T = typename decltype(s)::element_type;
              if constexpr (std::same_as<T, float>) {
                gc::codec_context ctx;
                ctx.seed = seed;
                gc::all_reduce_compressed(c, codec, gc::tensor_view<float const>(std::span<float const>(s)), s, ctx);
              } else {
                throw gc::config_error("gradcomp: Communicator.all_reduce_compressed takes float32");
              }
              return 0;
            });
            return t;
          },
          py::arg("codec"), py::arg("tensor"), py::arg("seed") = 0,
          "all_reduce_compressed (sum) of a float32 tensor in place, over the process group.")
      .def(
          "all_reduce",
          [](gc::c10d_communicator& c, at::Tensor t, std::string const& op) {
            if (!t.is_contiguous() || !t.device().is_cpu()) throw gc::config_error("gradcomp: a contiguous CPU tensor");
            gc::comm_type ct{};
            switch (t.scalar_type()) {
              case at::kFloat: ct = gc::comm_type::f32; break;
              case at::kDouble: ct = gc::comm_type::f64; break;
              case at::kHalf: ct = gc::comm_type::f16; break;
              case at::kBFloat16: ct = gc::comm_type::bf16; break;
              case at::kInt: ct = gc::comm_type::i32; break;
              case at::kLong: ct = gc::comm_type::i64; break;
              case at::kByte: ct = gc::comm_type::u8; break;
              default: throw gc::config_error("gradcomp: unsupported dtype");
            }
            gc::reduce_op rop = op == "sum" ? gc::reduce_op::sum
                                : op == "max" ? gc::reduce_op::max
                                : op == "min" ? gc::reduce_op::min
                                              : throw gc::config_error("gradcomp: op must be sum, max or min");
            py::gil_scoped_release nogil;
            c.all_reduce(std::span<std::byte>(reinterpret_cast<std::byte*>(t.data_ptr()),
                                              static_cast<std::size_t>(t.numel() * t.element_size())),
                         ct, rop);
            return t;
          },
          py::arg("tensor"), py::arg("op") = "sum", "The communicator's all_reduce, in place.")
      .def(
          "all_gather_v",
          [](gc::c10d_communicator& c, at::Tensor in, std::vector<std::size_t> counts) {
            if (!in.is_contiguous() || in.scalar_type() != at::kByte) throw gc::config_error("gradcomp: a uint8 tensor");
            std::size_t total = 0;
            for (auto x : counts) total += x;
            at::Tensor out = at::empty({static_cast<std::int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
            py::gil_scoped_release nogil;
            c.all_gather_v(packet_bytes(in),
                           std::span<std::byte>(reinterpret_cast<std::byte*>(out.data_ptr()), total), counts);
            return out;
          },
          py::arg("tensor"), py::arg("counts"), "The communicator's all_gather_v of uint8 tensors.");

  // The optimizers (issue 33): gradcomp.OneBitAdam's engine.
  bind_optimizers(m);
  // The DiLoCo-family sync step (optim/local_update.hpp); python/gradcomp/diloco.py wraps it.
  py::class_<gc::local_update>(m, "LocalUpdate")
      .def(py::init([](py::dict const& o) { return gc::local_update(local_update_options_from(o)); }),
           py::arg("options"), "options: outer, outer_lr, outer_momentum, sync_every, fragments, overlap, mix, "
                               "codec, feedback, seed, checksum (optim/local_update.hpp)")
      .def(
          "start",
          [](gc::local_update& lu, gc::c10d_communicator& c, std::vector<at::Tensor> const& ts) {
            std::vector<std::span<float>> const w = weight_spans(ts);
            py::gil_scoped_release nogil;
            lu.start(c, std::span<std::span<float> const>(w));
          },
          py::arg("communicator"), py::arg("tensors"),
          "Rank 0's tensors on every rank (in place), theta_sync = them; collective.")
      .def(
          "step",
          [](gc::local_update& lu, gc::c10d_communicator& c, std::vector<at::Tensor> const& ts) {
            std::vector<std::span<float>> const w = weight_spans(ts);
            gc::local_update_stats st;
            {
              py::gil_scoped_release nogil;
              st = lu.step(c, std::span<std::span<float> const>(w));
            }
            return local_update_stats_dict(st);
          },
          py::arg("communicator"), py::arg("tensors"),
          "After an inner step: syncs the fragments due (collective), applies delayed results; returns its stats.")
      .def(
          "flush",
          [](gc::local_update& lu, std::vector<at::Tensor> const& ts) {
            std::vector<std::span<float>> const w = weight_spans(ts);
            return lu.flush(std::span<std::span<float> const>(w));
          },
          py::arg("tensors"), "Applies every pending delayed result now; returns the fragments.")
      .def(
          "acts_at",
          [](gc::local_update const& lu, std::uint64_t t) {
            for (std::uint64_t f = 0; f < lu.options().fragments; ++f)
              if (lu.syncs_at(f, t) || lu.pending_application(f) == t) return true;
            return false;
          },
          py::arg("step"), "Whether step `step` syncs a fragment or applies a delayed result (reads the weights).")
      .def("save",
           [](gc::local_update const& lu) {
             std::vector<std::byte> const b = lu.save();
             return py::bytes(reinterpret_cast<char const*>(b.data()), b.size());
           })
      .def("load",
           [](gc::local_update& lu, py::bytes const& b) {
             std::string const s = b;
             lu.load(std::span<std::byte const>(reinterpret_cast<std::byte const*>(s.data()), s.size()));
           })
      .def("synchronized", [](gc::local_update const& lu, std::size_t i) {
             std::span<float const> const s = lu.synchronized_weights(i);
             at::Tensor t = at::empty({static_cast<std::int64_t>(s.size())}, at::TensorOptions().dtype(at::kFloat));
             std::memcpy(t.data_ptr(), s.data(), s.size_bytes());
             return t;
           }, py::arg("index"), "A copy of theta_sync of tensor `index` (flat).")
      .def_property_readonly("steps", &gc::local_update::steps)
      .def_property_readonly("syncs", &gc::local_update::syncs)
      .def_property_readonly("started", &gc::local_update::started)
      .def_property_readonly("bytes_sent", &gc::local_update::bytes_sent)
      .def_property_readonly("wire_bytes", &gc::local_update::wire_bytes)
      .def_property_readonly("outer_lr", [](gc::local_update const& lu) { return *lu.options().outer_lr; })
      .def_property_readonly("outer_momentum", [](gc::local_update const& lu) { return *lu.options().outer_momentum; });
}
