// ladle._ladle: the C++ library as Python sees it (nanobind). Tensors cross as DLPack capsules,
// taken over by ladle::DLPackTensor (runtime/dlpack.h), so nothing is copied in either direction;
// outputs and gradients are the caller's (torch.empty, numpy.empty), written in place. The Python
// package (python/ladle) builds variants, checks arguments the way the C++ ops do and wraps these
// calls as torch custom ops.
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <ladle/dsl/ir.h>
#include <ladle/ops/attention.h>
#include <ladle/ops/context_parallel.h>
#include <ladle/ops/generated_kernels.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/background.h>
#include <ladle/runtime/communicator.h>
#include <ladle/runtime/dlpack.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/version.h>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The capsules of one call, taken over for the call's length (their deleters run at the end, with
// the GIL held, as numpy's need).
class Capsules {
 public:
  ladle::TensorView take(nb::handle capsule, const std::string& name) {
    PyObject* object = capsule.ptr();
    if (!PyCapsule_IsValid(object, "dltensor"))
      throw ladle::InvalidArgument(name + ": expected a DLPack capsule that was not used yet (from torch.utils.dlpack.to_dlpack "
                                          "or __dlpack__()), got " + std::string(Py_TYPE(object)->tp_name));
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(object, "dltensor"));
    PyCapsule_SetName(object, "used_dltensor");  // ownership passes here, as DLPack asks
    return held_.emplace_back(managed).view();
  }
  std::optional<ladle::TensorView> take_optional(nb::handle capsule, const std::string& name) {
    if (capsule.is_none()) return std::nullopt;
    return take(capsule, name);
  }
  // q, k, v and the named inputs of a call.
  struct Arguments {
    ladle::TensorView q, k, v;
    ladle::VariantInputs inputs;
  };
  Arguments take_arguments(nb::handle q, nb::handle k, nb::handle v, const nb::dict& tensors,
                           const std::map<std::string, float>& scalars) {
    Arguments a{take(q, "q"), take(k, "k"), take(v, "v"), {}};
    a.inputs.tensors = take_all(tensors, "");
    a.inputs.scalars = scalars;
    return a;
  }
  // The capsules taken so far, for a value that outlives the call (a saved forward's views).
  std::vector<ladle::DLPackTensor> release() { return std::move(held_); }
  std::map<std::string, ladle::TensorView> take_all(const nb::dict& capsules, const std::string& what) {
    std::map<std::string, ladle::TensorView> views;
    for (auto [key, value] : capsules) {
      const std::string name = nb::cast<std::string>(key);
      views.emplace(name, take(value, what + name));
    }
    return views;
  }

 private:
  std::vector<ladle::DLPackTensor> held_ = [] {
    std::vector<ladle::DLPackTensor> v;
    v.reserve(8);  // a call takes 5-12 capsules
    return v;
  }();
};

// A ladle tensor handed to Python as a DLPack capsule (torch.utils.dlpack.from_dlpack takes it): the
// capsule owns it until a consumer renames the capsule, as DLPack asks.
nb::object to_capsule(ladle::Tensor tensor) {
  DLManagedTensor* managed = ladle::to_dlpack(std::move(tensor));
  PyObject* capsule = PyCapsule_New(managed, "dltensor", [](PyObject* self) {
    if (!PyCapsule_IsValid(self, "dltensor")) return;  // taken by a consumer
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(self, "dltensor"));
    if (m->deleter) m->deleter(m);
  });
  if (capsule == nullptr) {
    managed->deleter(managed);
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

// An attention forward kept for its backward: the saved value and the caller's tensors behind its
// views (their DLPack owners), alive until the backward's autograd node dies.
struct SavedAttention {
  ladle::AttentionSaved saved;
  std::vector<ladle::DLPackTensor> held;
};

// An attention call's end, shared by the named op and DSL variants: the forward run without the GIL
// (keeping its saved value, with the caller's tensors behind it, when a backward will follow), then
// o, lse (or None) and the saved value (or None) for Python.
template <class ForBackward, class Plain>
nb::tuple finish_attention(Capsules& held, bool for_backward, ForBackward&& forward, Plain&& plain) {
  nb::object saved = nb::none();
  ladle::AttentionResult result;
  if (for_backward) {
    ladle::AttentionForward f;
    {
      nb::gil_scoped_release release;
      f = forward();
    }
    result = std::move(f.result);
    // The backward runs on the stream of its own call: saved must not keep this one's.
    f.saved.options.gpu.stream = nullptr;
    saved = nb::cast(SavedAttention{std::move(f.saved), held.release()});
  } else {
    nb::gil_scoped_release release;
    result = plain();
  }
  nb::object lse = result.lse ? to_capsule(std::move(*result.lse)) : nb::none();
  return nb::make_tuple(to_capsule(std::move(result.o)), lse, saved);
}

ladle::Backend backend_of(const std::string& name) {
  if (name == "auto" || name == "automatic") return ladle::Backend::automatic;
  if (name == "cpu") return ladle::Backend::cpu;
  if (name == "gpu" || name == "cuda") return ladle::Backend::gpu;
  throw ladle::InvalidArgument("backend is '" + name + "', expected 'auto', 'cpu' or 'cuda'");
}

// The update forms' backward (RunOptions::update_backward) by its Python name.
ladle::UpdateBackward update_backward_of(const std::string& name) {
  if (name == "auto") return ladle::UpdateBackward::automatic;
  if (name == "recurrent") return ladle::UpdateBackward::recurrent;
  if (name == "chunked") return ladle::UpdateBackward::chunked;
  throw ladle::InvalidArgument("update_backward is '" + name + "', expected 'auto', 'recurrent' or 'chunked'");
}

ladle::Algorithm algorithm_of(const std::string& name) {
  if (name == "auto" || name == "automatic") return ladle::Algorithm::automatic;
  if (name == "chunked" || name == "chunk") return ladle::Algorithm::chunked;
  if (name == "recurrent" || name == "fused_recurrent") return ladle::Algorithm::recurrent;
  throw ladle::InvalidArgument("algorithm is '" + name + "', expected 'auto', 'chunked' or 'recurrent'");
}

ladle::ir::Op op_of(const std::string& name) {
  using ladle::ir::Op;
  for (int i = static_cast<int>(Op::neg); i <= static_cast<int>(Op::logical_not); ++i)
    if (name == ladle::ir::op_name(static_cast<Op>(i))) return static_cast<Op>(i);
  throw ladle::InvalidArgument("no elementwise operation named '" + name + "'");
}

ladle::ir::InputKind kind_of(const std::string& name) {
  using ladle::ir::InputKind;
  for (InputKind kind : {InputKind::token_key, InputKind::token_value, InputKind::token_head, InputKind::head, InputKind::head_key,
                         InputKind::scalar, InputKind::pair})
    if (name == ladle::ir::kind_name(kind)) return kind;
  throw ladle::InvalidArgument("no input kind named '" + name + "'");
}

ladle::ir::Role role_of(const std::string& name) {
  using ladle::ir::Role;
  for (Role role : {Role::query, Role::key, Role::value, Role::other})
    if (name == ladle::ir::role_name(role)) return role;
  throw ladle::InvalidArgument("no input role named '" + name + "'");
}

// One slot's expression from the Python DSL's nested tuples:
//   ("input", name, kind, role) | ("constant", value) | ("leaf", op) | (op, a) | (op, a, b)
std::int32_t build(ladle::ir::ExprBuilder& builder, nb::handle node) {
  const nb::tuple t = nb::cast<nb::tuple>(node);
  const std::string head = nb::cast<std::string>(t[0]);
  if (head == "leaf") {
    const std::string leaf = nb::cast<std::string>(t[1]);
    for (ladle::ir::Op op : {ladle::ir::Op::score, ladle::ir::Op::query_index, ladle::ir::Op::key_index, ladle::ir::Op::head_index,
                             ladle::ir::Op::batch_index})
      if (leaf == ladle::ir::op_name(op)) return builder.leaf(op);
    throw ladle::InvalidArgument("no attention leaf named '" + leaf + "'");
  }
  if (head == "input") {
    const std::string name = nb::cast<std::string>(t[1]);
    return builder.input(name.c_str(), kind_of(nb::cast<std::string>(t[2])), role_of(nb::cast<std::string>(t[3])));
  }
  if (head == "constant") return builder.constant(nb::cast<float>(t[1]));
  const ladle::ir::Op op = op_of(head);
  if (t.size() == 2) return builder.unary(op, build(builder, t[1]));
  const std::int32_t a = build(builder, t[1]);
  return builder.binary(op, a, build(builder, t[2]));
}

// What ir::validate found wrong with a variant from Python, as one InvalidArgument.
void refuse_problems(const std::string& name, const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::string all;
  for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
  throw ladle::InvalidArgument(name + ": " + all);
}

// (name, kind, role) of every input, for Python.
std::vector<std::tuple<std::string, std::string, std::string>> inputs_of(const std::vector<ladle::ir::Input>& inputs) {
  std::vector<std::tuple<std::string, std::string, std::string>> out;
  for (const auto& in : inputs) out.emplace_back(in.name, ladle::ir::kind_name(in.kind), ladle::ir::role_name(in.role));
  return out;
}

ladle::ir::Slot slot_of(const std::string& name) {
  for (std::size_t i = 0; i < ladle::ir::slot_count; ++i)
    if (name == ladle::ir::slot_name(static_cast<ladle::ir::Slot>(i))) return static_cast<ladle::ir::Slot>(i);
  throw ladle::InvalidArgument("no slot named '" + name + "'");
}

// A variant from the Python DSL: slots by name, the update form's flags; checked by ir::validate.
ladle::ir::Variant make_variant(const std::string& name, const nb::dict& slots, bool delta, bool read_before, bool l2, bool normalize,
                                float eps) {
  ladle::ir::Variant variant;
  variant.name = name;
  // Slot order, as the C++ DSL lowers them, so that the same expression hashes alike from both.
  std::map<ladle::ir::Slot, nb::handle> ordered;
  for (auto [key, value] : slots) ordered.emplace(slot_of(nb::cast<std::string>(key)), value);
  for (const auto& [slot, expr] : ordered) {
    ladle::ir::ExprBuilder builder(variant);
    build(builder, expr);
    variant.slot(slot) = builder.take();
  }
  variant.update = delta ? ladle::ir::Update::delta : ladle::ir::Update::additive;
  variant.read_before_update = read_before;
  variant.l2_normalize_qk = l2;
  variant.normalize = normalize;
  variant.normalize_eps = eps;
  refuse_problems(name.empty() ? "variant" : name, ladle::ir::validate(variant));
  return variant;
}

// A softmax-attention variant from the Python DSL: q, k, v first (as dsl::lower puts them), the score
// and the optional keep predicate, the structural flags; checked by ir::validate.
ladle::ir::AttentionVariant make_attention_variant(const std::string& name, nb::handle score, nb::handle keep, bool causal, bool window,
                                                   bool segment_ids, bool sinks, bool dropout) {
  using ladle::ir::InputKind, ladle::ir::Role;
  ladle::ir::AttentionVariant variant;
  variant.name = name;
  {
    ladle::ir::ExprBuilder inputs(variant.inputs);
    inputs.input("q", InputKind::token_key, Role::query);
    inputs.input("k", InputKind::token_key, Role::key);
    inputs.input("v", InputKind::token_value, Role::value);
  }
  ladle::ir::ExprBuilder logit(variant.inputs);
  build(logit, score);
  variant.score = logit.take();
  if (!keep.is_none()) {
    ladle::ir::ExprBuilder predicate(variant.inputs);
    build(predicate, keep);
    variant.keep = predicate.take();
  }
  variant.causal = causal, variant.window = window, variant.segment_ids = segment_ids, variant.sinks = sinks, variant.dropout = dropout;
  refuse_problems(name.empty() ? "attention variant" : name, ladle::ir::validate(variant));
  return variant;
}

// The options every call shares.
ladle::RunOptions run_options(Capsules& held, nb::handle initial_state, nb::handle cu_seqlens, bool reverse, const std::string& backend,
                              const std::string& algorithm, const ladle::Stream* stream, bool upload) {
  ladle::RunOptions options;
  options.initial_state = held.take_optional(initial_state, "initial_state");
  options.cu_seqlens = held.take_optional(cu_seqlens, "cu_seqlens");
  options.reverse = reverse;
  options.backend = backend_of(backend);
  options.algorithm = algorithm_of(algorithm);
  options.gpu.stream = stream;
  // The torch entry passes false: its tensors are where it put them, and a host one on the GPU path
  // is refused by name rather than copied unnoticed.
  options.gpu.upload_host_tensors = upload;
  return options;
}

std::optional<ladle::Stream> stream_of(std::uintptr_t handle, bool given) {
  if (!given) return std::nullopt;
  return ladle::Stream::borrowed(reinterpret_cast<void*>(handle));
}

// An NCCL communicator made for Python (ladle::nccl::init_rank, one per process and GPU), destroyed
// with this object: Python has no ncclComm_t of its own to hand over.
class OwnedNccl final : public ladle::Communicator {
 public:
  OwnedNccl(int ranks, const nb::bytes& id, int rank) {
    ladle::nccl::UniqueId unique;
    if (id.size() != unique.bytes.size())
      throw ladle::InvalidArgument("NcclCommunicator: id has " + std::to_string(id.size()) + " bytes, expected " +
                                   std::to_string(unique.bytes.size()) + " (ladle.nccl_unique_id())");
    std::memcpy(unique.bytes.data(), id.c_str(), unique.bytes.size());
    comm_ = ladle::nccl::init_rank(ranks, unique, rank);
    inner_ = std::make_unique<ladle::NcclCommunicator>(comm_);
  }
  ~OwnedNccl() override {
    inner_.reset();
    try {
      ladle::nccl::destroy(comm_);
    } catch (...) {  // a destructor reports nothing
    }
  }
  OwnedNccl(const OwnedNccl&) = delete;
  OwnedNccl& operator=(const OwnedNccl&) = delete;
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  ladle::Location location() const override { return inner_->location(); }
  void all_gather(const void* send, void* receive, std::size_t bytes, const ladle::Stream* stream) override {
    inner_->all_gather(send, receive, bytes, stream);
  }
  void all_sum(float* data, std::size_t count, const ladle::Stream* stream) override { inner_->all_sum(data, count, stream); }
  std::string describe() const override { return inner_->describe(); }

 private:
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<ladle::NcclCommunicator> inner_;
};

}  // namespace

NB_MODULE(_ladle, m) {
  m.doc() = "ladle's C++ library: variants, the recurrent run and its backward, generated kernels";
  // ladle.Variant objects live in a registry until the interpreter exits (the torch ops name them by
  // hash), so nanobind's exit-time leak report would list them every time.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ladle::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const ladle::LibraryUnavailable& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  m.attr("version") = ladle::version();

  nb::class_<ladle::ir::Variant>(m, "Variant")
      .def_prop_ro("name", [](const ladle::ir::Variant& v) { return v.name; })
      .def_prop_ro("hash", [](const ladle::ir::Variant& v) { return ladle::ir::hash_hex(v); })
      .def_prop_ro("form", [](const ladle::ir::Variant& v) { return ladle::ir::form_name(v); })
      .def_prop_ro("plain_form", &ladle::ir::Variant::plain_form)
      .def_prop_ro("inputs", [](const ladle::ir::Variant& v) { return inputs_of(v.inputs); },
                   "(name, kind, role) of every input, in order of first use")
      .def("__str__", [](const ladle::ir::Variant& v) { return ladle::ir::to_string(v); })
      .def("__repr__", [](const ladle::ir::Variant& v) { return "<ladle.Variant " + (v.name.empty() ? std::string("variant") : v.name) + " " + ladle::ir::hash_hex(v) + ">"; });

  m.def("make_variant", &make_variant, "name"_a, "slots"_a, "delta"_a = false, "read_before"_a = false, "l2"_a = false,
        "normalize"_a = false, "eps"_a = 1e-10f);
  m.def("named_variant", [](const std::string& op, const std::string& gates) { return ladle::named_variant(op, gates); }, "op"_a,
        "gates"_a = "");
  m.def("input_shape", [](const std::string& kind, const std::string& role) { return ladle::ir::shape_of(kind_of(kind), role_of(role)); });

  m.def(
      "run",
      [](const ladle::ir::Variant& variant, nb::handle q, nb::handle k, nb::handle v, const nb::dict& tensors,
         const std::map<std::string, float>& scalars, nb::handle o, nb::handle final_state, nb::handle initial_state,
         nb::handle cu_seqlens, bool reverse, const std::string& backend, const std::string& algorithm, std::uintptr_t stream,
         bool has_stream, bool upload, ladle::Communicator* group) {
        Capsules held;
        const auto [qv, kv, vv, inputs] = held.take_arguments(q, k, v, tensors, scalars);
        const std::optional<ladle::Stream> s = stream_of(stream, has_stream);
        ladle::RunOptions options = run_options(held, initial_state, cu_seqlens, reverse, backend, algorithm, s ? &*s : nullptr, upload);
        ladle::RecurrentOutputs outputs{held.take(o, "o"), held.take_optional(final_state, "final_state")};
        options.return_state = outputs.final_state.has_value();
        nb::gil_scoped_release release;  // with a group of threads, the other ranks run while this one waits for them
        if (group) ladle::context_parallel::run_variant_into(variant, qv, kv, vv, inputs, options, outputs, *group);
        else ladle::run_variant_into(variant, qv, kv, vv, inputs, options, outputs);
      },
      "variant"_a, "q"_a, "k"_a, "v"_a, "tensors"_a, "scalars"_a, "o"_a, "final_state"_a.none(), "initial_state"_a.none(),
      "cu_seqlens"_a.none(), "reverse"_a, "backend"_a, "algorithm"_a, "stream"_a, "has_stream"_a, "upload"_a, "group"_a.none() = nb::none());

  m.def(
      "backward",
      [](const ladle::ir::Variant& variant, nb::handle q, nb::handle k, nb::handle v, const nb::dict& tensors,
         const std::map<std::string, float>& scalars, nb::handle initial_state, nb::handle cu_seqlens, bool reverse,
         const std::string& backend, std::uintptr_t stream, bool has_stream, bool upload, nb::handle d_output, nb::handle d_final_state,
         nb::handle dq, nb::handle dk, nb::handle dv, const nb::dict& d_tensors, nb::handle d_initial_state,
         const std::string& update_backward, ladle::Communicator* group) {
        Capsules held;
        const auto [qv, kv, vv, inputs] = held.take_arguments(q, k, v, tensors, scalars);
        const std::optional<ladle::Stream> s = stream_of(stream, has_stream);
        ladle::RunOptions options = run_options(held, initial_state, cu_seqlens, reverse, backend, "auto", s ? &*s : nullptr, upload);
        options.update_backward = update_backward_of(update_backward);
        const ladle::TensorView d_o = held.take(d_output, "d_output");
        const std::optional<ladle::TensorView> d_final = held.take_optional(d_final_state, "d_final_state");
        ladle::RecurrentGradientViews grads{held.take(dq, "dq"), held.take(dk, "dk"), held.take(dv, "dv"),
                                            held.take_all(d_tensors, "d"), held.take_optional(d_initial_state, "d_initial_state")};
        nb::gil_scoped_release release;
        if (group) ladle::context_parallel::run_variant_backward_into(variant, qv, kv, vv, inputs, options, d_o, d_final, grads, *group);
        else ladle::run_variant_backward_into(variant, qv, kv, vv, inputs, options, d_o, d_final, grads);
      },
      "variant"_a, "q"_a, "k"_a, "v"_a, "tensors"_a, "scalars"_a, "initial_state"_a.none(), "cu_seqlens"_a.none(), "reverse"_a,
      "backend"_a, "stream"_a, "has_stream"_a, "upload"_a, "d_output"_a, "d_final_state"_a.none(), "dq"_a, "dk"_a, "dv"_a, "d_tensors"_a,
      "d_initial_state"_a.none(), "update_backward"_a = "auto", "group"_a.none() = nb::none());

  // Context parallelism (ops/context_parallel.h): the ranks, and run / backward over them.
  nb::class_<ladle::Communicator>(m, "Communicator")
      .def_prop_ro("rank", &ladle::Communicator::rank)
      .def_prop_ro("size", &ladle::Communicator::size)
      .def("__repr__", &ladle::Communicator::describe);
  nb::class_<ladle::ThreadGroup>(m, "ThreadGroup")
      .def(
          "__init__",
          [](ladle::ThreadGroup* self, int size, bool device) {
            new (self) ladle::ThreadGroup(size, device ? ladle::Location::device(0) : ladle::Location::host());
          },
          "size"_a, "device"_a = false)
      .def_prop_ro("size", &ladle::ThreadGroup::size)
      .def("rank", &ladle::ThreadGroup::rank, "r"_a, nb::rv_policy::reference_internal);
  nb::class_<OwnedNccl, ladle::Communicator>(m, "NcclCommunicator").def(nb::init<int, const nb::bytes&, int>(), "ranks"_a, "id"_a, "rank"_a);
  m.def("nccl_unique_id", [] {
    const ladle::nccl::UniqueId id = ladle::nccl::unique_id();
    return nb::bytes(id.bytes.data(), id.bytes.size());
  });

  nb::class_<SavedAttention>(m, "SavedAttention");
  m.def(
      "attention",
      [](nb::handle q, nb::handle k, nb::handle v, std::optional<float> scale, nb::handle bias, std::optional<float> soft_cap,
         bool causal, std::optional<std::pair<std::int64_t, std::int64_t>> window, nb::handle mask, nb::handle q_segment_ids,
         nb::handle kv_segment_ids, nb::handle sinks, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, float dropout_p,
         std::uint64_t seed, bool return_lse, bool for_backward, const std::string& backend, std::uintptr_t stream,
         bool has_stream) {
        Capsules held;
        ladle::AttentionOptions options;
        const ladle::TensorView qv = held.take(q, "q"), kv = held.take(k, "k"), vv = held.take(v, "v");
        options.scale = scale;
        options.bias = held.take_optional(bias, "bias");
        options.logits_soft_cap = soft_cap;
        options.causal = causal;
        options.sliding_window = window;
        options.attention_mask = held.take_optional(mask, "attn_mask");
        options.q_segment_ids = held.take_optional(q_segment_ids, "q_segment_ids");
        options.kv_segment_ids = held.take_optional(kv_segment_ids, "kv_segment_ids");
        options.softmax_aux = held.take_optional(sinks, "sinks");
        options.cu_seqlens_q = held.take_optional(cu_seqlens_q, "cu_seqlens_q");
        options.cu_seqlens_k = held.take_optional(cu_seqlens_k, "cu_seqlens_k");
        options.dropout_p = dropout_p;
        options.seed = seed;
        options.return_lse = return_lse;
        options.backend = backend_of(backend);
        options.gpu.upload_host_tensors = false;
        // The saved tensors are torch's, which autograd guards by their version counters
        // (ladle.torch's _Attention saves them): no content fingerprint, no waits for it.
        options.check_saved = false;
        const ladle::Stream s = ladle::Stream::borrowed(reinterpret_cast<void*>(stream));
        options.gpu.stream = has_stream ? &s : nullptr;
        return finish_attention(
            held, for_backward, [&] { return ladle::attention_for_backward(qv, kv, vv, options); },
            [&] { return ladle::attention(qv, kv, vv, options); });
      },
      "q"_a, "k"_a, "v"_a, "scale"_a.none(), "bias"_a.none(), "soft_cap"_a.none(), "causal"_a, "window"_a.none(),
      "mask"_a.none(), "q_segment_ids"_a.none(), "kv_segment_ids"_a.none(), "sinks"_a.none(), "cu_seqlens_q"_a.none(),
      "cu_seqlens_k"_a.none(), "dropout_p"_a, "seed"_a, "return_lse"_a, "for_backward"_a, "backend"_a, "stream"_a,
      "has_stream"_a);

  nb::class_<ladle::ir::AttentionVariant>(m, "AttentionVariant")
      .def_prop_ro("name", [](const ladle::ir::AttentionVariant& v) { return v.name; })
      .def_prop_ro("hash", [](const ladle::ir::AttentionVariant& v) { return ladle::ir::hash_hex(v); })
      .def_prop_ro("inputs", [](const ladle::ir::AttentionVariant& v) { return inputs_of(v.inputs); })
      .def("__str__", [](const ladle::ir::AttentionVariant& v) { return ladle::ir::to_string(v); });
  m.def("make_attention_variant", &make_attention_variant, "name"_a, "score"_a, "keep"_a.none(), "causal"_a, "window"_a,
        "segment_ids"_a, "sinks"_a, "dropout"_a);
  m.def(
      "run_attention",
      [](const ladle::ir::AttentionVariant& variant, nb::handle q, nb::handle k, nb::handle v, const nb::dict& tensors,
         const std::map<std::string, float>& scalars, std::int64_t window_left, std::int64_t window_right, nb::handle q_segment_ids,
         nb::handle kv_segment_ids, nb::handle sinks, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, float dropout_p,
         std::uint64_t seed, bool return_lse, bool for_backward, const std::string& backend, std::uintptr_t stream,
         bool has_stream) {
        Capsules held;
        const auto [qv, kv, vv, inputs] = held.take_arguments(q, k, v, tensors, scalars);
        ladle::AttentionRunOptions options;
        options.window_left = window_left, options.window_right = window_right;
        options.q_segment_ids = held.take_optional(q_segment_ids, "q_segment_ids");
        options.kv_segment_ids = held.take_optional(kv_segment_ids, "kv_segment_ids");
        options.softmax_aux = held.take_optional(sinks, "sinks");
        options.cu_seqlens_q = held.take_optional(cu_seqlens_q, "cu_seqlens_q");
        options.cu_seqlens_k = held.take_optional(cu_seqlens_k, "cu_seqlens_k");
        options.dropout_p = dropout_p, options.seed = seed, options.return_lse = return_lse;
        options.backend = backend_of(backend);
        options.gpu.upload_host_tensors = false;
        // The saved tensors are torch's, which autograd guards by their version counters
        // (ladle.torch's _Attention saves them): no content fingerprint, no waits for it.
        options.check_saved = false;
        const ladle::Stream s = ladle::Stream::borrowed(reinterpret_cast<void*>(stream));
        options.gpu.stream = has_stream ? &s : nullptr;
        return finish_attention(
            held, for_backward, [&] { return ladle::run_attention_for_backward(variant, qv, kv, vv, inputs, options); },
            [&] { return ladle::run_attention(variant, qv, kv, vv, inputs, options); });
      },
      "variant"_a, "q"_a, "k"_a, "v"_a, "tensors"_a, "scalars"_a, "window_left"_a, "window_right"_a, "q_segment_ids"_a.none(),
      "kv_segment_ids"_a.none(), "sinks"_a.none(), "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "dropout_p"_a, "seed"_a,
      "return_lse"_a, "for_backward"_a, "backend"_a, "stream"_a, "has_stream"_a);

  m.def(
      "attention_backward",
      [](SavedAttention& saved, nb::handle d_output, std::uintptr_t stream, bool has_stream) {
        Capsules held;
        const ladle::TensorView d_o = held.take(d_output, "d_output");
        const ladle::Stream s = ladle::Stream::borrowed(reinterpret_cast<void*>(stream));
        saved.saved.options.gpu.stream = has_stream ? &s : nullptr;
        ladle::AttentionGradients grads;
        {
          nb::gil_scoped_release release;
          grads = ladle::run_attention_backward(saved.saved, d_o);
        }
        saved.saved.options.gpu.stream = nullptr;
        nb::dict out;
        out["q"] = to_capsule(std::move(grads.dq));
        out["k"] = to_capsule(std::move(grads.dk));
        out["v"] = to_capsule(std::move(grads.dv));
        for (auto& [name, tensor] : grads.inputs) out[nb::str(name.c_str())] = to_capsule(std::move(tensor));
        if (grads.d_softmax_aux) out["sinks"] = to_capsule(std::move(*grads.d_softmax_aux));
        return out;
      },
      "saved"_a, "d_output"_a, "stream"_a, "has_stream"_a);

  m.def(
      "generated_kernels",
      [](const ladle::ir::Variant& variant, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t key_dim,
         std::int64_t value_dim, const std::string& dtype, const std::string& arch, const std::string& algorithm, bool compile) {
        ladle::CallShape shape;
        shape.batch = batch, shape.tokens = tokens, shape.heads = heads, shape.key_dim = key_dim, shape.value_dim = value_dim;
        shape.type = ladle::parse_dtype(dtype);
        ladle::RunOptions options;
        options.algorithm = algorithm_of(algorithm);
        nb::list out;
        std::vector<ladle::GeneratedKernel> kernels;
        {
          nb::gil_scoped_release release;
          kernels = ladle::generated_kernels(variant, shape, options, arch);
        }
        for (const ladle::GeneratedKernel& k : kernels) {
          nb::dict d;
          d["name"] = k.name, d["source"] = k.source, d["role"] = k.role, d["tile"] = k.tile;
          d["threads"] = k.threads, d["dynamic_shared_bytes"] = k.dynamic_shared_bytes;
          if (compile) {
            // NVRTC through the disk cache, as the launcher compiles it (no GPU needed).
            ladle::CompiledProgram program;
            {
              nb::gil_scoped_release release;
              program = ladle::compile_generated(k, arch);
            }
            d["ptx"] = program.ptx;
            d["from_cache"] = program.from_cache;
            if (const ladle::KernelResources* r = program.resources(k.name)) {
              d["registers"] = r->registers;
              d["spill_store_bytes"] = r->spill_store_bytes;
              d["spill_load_bytes"] = r->spill_load_bytes;
              d["static_shared_bytes"] = r->shared_bytes;
            }
          }
          out.append(d);
        }
        return out;
      },
      "variant"_a, "batch"_a, "tokens"_a, "heads"_a, "key_dim"_a, "value_dim"_a, "dtype"_a, "arch"_a, "algorithm"_a, "compile"_a);

  m.def("driver_available", [] { return ladle::driver_available(); }, "whether libcuda could be opened");
  m.def(
      "finish_background_compiles", [] {
        nb::gil_scoped_release released;
        ladle::finish_background_compiles();
      },
      "wait until every kernel compile a cold call started in the background has ended (time after it: "
      "a cold chunked call runs the fused recurrent kernel meanwhile)");
}
