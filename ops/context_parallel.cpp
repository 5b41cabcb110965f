// Context parallelism for the recurrent family (context_parallel.h).
#include "context_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <map>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include <ladle/codegen/cuda/context_parallel.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "bind.h"
#include "detail/checks.h"
#include "detail/loaded_kernel.h"
#include "gpu_backward.h"
#include "gpu_recurrent.h"
#include "attention_bind.h"
#include "gpu_attention.h"
#include "gpu_attention_backward.h"
#include <ladle/codegen/cpu/attention.h>

namespace ladle::context_parallel {
namespace {

std::string op_name(const ir::Variant& variant, const char* what) {
  return fmt::format("{} context parallel {}", variant.name.empty() ? "variant" : variant.name, what);
}

std::uint64_t address(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// ---- What every rank checks about every other -------------------------------------------------

// One rank's call, exchanged first: its verdict on its own arguments and the sizes every rank must
// agree on. A refused rank still takes part, so that every rank reports the refusal instead of
// waiting in the next collective.
struct Descriptor {
  enum Field {
    status,  // 0: the rank's arguments are fine; 1: refused (message)
    variant_hash, dtype, batch, tokens, heads, kv_heads, key_dim, value_dim, sequences, reverse, has_initial_state,
    return_state, packed, offsets_hash, offsets_total, location, scalars_hash, window_left, window_right, count
  };
  std::int64_t values[count] = {};
  char message[384] = {};
};
static_assert(sizeof(Descriptor) % 8 == 0);

const char* field_name(int field) {
  switch (field) {
    case Descriptor::variant_hash: return "the variant";
    case Descriptor::dtype: return "the dtype of q, k and v";
    case Descriptor::batch: return "the batch B";
    case Descriptor::heads: return "the heads H";
    case Descriptor::kv_heads: return "the key/value heads H_kv";
    case Descriptor::key_dim: return "the key dim K";
    case Descriptor::value_dim: return "the value dim V";
    case Descriptor::sequences: return "the sequences N";
    case Descriptor::reverse: return "options.reverse";
    case Descriptor::has_initial_state: return "whether options.initial_state is given";
    case Descriptor::return_state: return "options.return_state (attention: options.return_lse)";
    case Descriptor::packed: return "whether options.cu_seqlens is given";
    case Descriptor::offsets_hash: return "options.cu_seqlens (the whole call's offsets, the same on every rank)";
    case Descriptor::location: return "where the tensors live";
    case Descriptor::scalars_hash: return "the scalar inputs";
    case Descriptor::window_left: return "the window's left size";
    case Descriptor::window_right: return "the window's right size";
    default: return "a field";
  }
}

std::uint64_t mix(std::uint64_t h, std::uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

// The scalar inputs (name and bits), which every rank must pass alike.
std::int64_t scalars_hash(const VariantInputs& inputs) {
  std::uint64_t h = 0;
  for (const auto& [name, value] : inputs.scalars) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    h = mix(mix(h, std::hash<std::string>{}(name)), bits);
  }
  return static_cast<std::int64_t>(h);
}

// The ranks' descriptors, gathered; throws the same InvalidArgument on every rank where any refused
// its arguments or where they disagree.
std::vector<Descriptor> exchange(const std::string& op, Communicator& group, const Descriptor& mine, const Stream* stream) {
  const int P = group.size();
  std::vector<Descriptor> all(static_cast<std::size_t>(P));
  if (group.location().is_device()) {
    DeviceBuffer send(sizeof(Descriptor)), receive(sizeof(Descriptor) * P);
    send.copy_from_host(&mine, sizeof mine, 0, stream);
    group.all_gather(reinterpret_cast<void*>(send.device_ptr()), reinterpret_cast<void*>(receive.device_ptr()), sizeof mine, stream);
    receive.copy_to_host(all.data(), sizeof(Descriptor) * P, 0, stream);
    if (stream) stream->synchronize();
    else Device::get().synchronize();
  } else {
    group.all_gather(&mine, all.data(), sizeof mine, stream);
  }
  for (int r = 0; r < P; ++r)
    if (all[r].values[Descriptor::status] != 0)
      throw InvalidArgument(r == group.rank() ? std::string(all[r].message)
                                              : fmt::format("{}: rank {} of {} refused its arguments: {}", op, r, P, all[r].message));
  for (int field = Descriptor::variant_hash; field < Descriptor::count; ++field) {
    if (field == Descriptor::tokens || field == Descriptor::offsets_total) continue;
    for (int r = 1; r < P; ++r)
      if (all[r].values[field] != all[0].values[field])
        throw InvalidArgument(fmt::format("{}: the ranks disagree on {}: rank 0 has {}, rank {} has {} (every rank passes its "
                                          "slice of one call)",
                                          op, field_name(field), all[0].values[field], r, all[r].values[field]));
  }
  for (int r = 0; r < P; ++r)
    if (all[r].values[Descriptor::tokens] < 1)
      throw InvalidArgument(fmt::format("{}: rank {} holds {} tokens, expected at least 1 (every rank holds a slice)", op, r,
                                        all[r].values[Descriptor::tokens]));
  if (all[0].values[Descriptor::packed]) {
    std::int64_t total = 0;
    for (const Descriptor& d : all) total += d.values[Descriptor::tokens];
    if (total != all[0].values[Descriptor::offsets_total])
      throw InvalidArgument(fmt::format("{}: options.cu_seqlens ends at {}, but the ranks' slices hold {} tokens together "
                                        "(cu_seqlens is the whole call's, over every rank's tokens in rank order)",
                                        op, all[0].values[Descriptor::offsets_total], total));
  }
  return all;
}

// ---- Where each rank's pieces of each sequence lie ---------------------------------------------

struct Piece {
  std::int64_t lo = 0, hi = 0;  // local tokens
  std::int64_t sequence = 0;    // the whole call's
};

struct RankPieces {
  std::vector<Piece> pieces;             // in token order (batch: one per batch row)
  std::int64_t in = -1, out = -1;        // varlen: the piece carried in / carried out, in the recurrence's direction; -1: none
};

// One fold's rows: for each local piece, the state (or dS) it starts from.
struct FoldRow {
  std::int64_t source = -1;  // row of initial_state / d_final_state, -1: zero
  std::int64_t first = 0, count = 0;  // positions in the fold's rank order
  std::int64_t summary = 0;  // the summaries' row
};

struct Layout {
  int P = 1, rank = 0;
  bool packed = false, reverse = false;
  std::int64_t B = 1, N = 0, R = 1;  // R: summary rows per rank (B, or 2 for packed: carried out, carried in)
  std::vector<std::int64_t> starts;  // packed: [P+1] the ranks' first tokens
  std::vector<std::int64_t> offsets;  // packed: the whole call's cu_seqlens
  std::vector<RankPieces> ranks;
  std::vector<int> order, reverse_order;  // the ranks in the recurrence's direction, and the other way

  const RankPieces& mine() const { return ranks[static_cast<std::size_t>(rank)]; }
  int position(int j) const { return reverse ? P - 1 - j : j; }
  bool holds(int j, std::int64_t n) const {
    if (!packed) return true;
    return offsets[n] < starts[j + 1] && offsets[n + 1] > starts[j];
  }
  bool carried_in(std::int64_t i) const { return packed ? mine().in == i : position(rank) > 0; }
  bool carried_out(std::int64_t i) const { return packed ? mine().out == i : position(rank) < P - 1; }

  // The fold's rows for this rank's pieces. entry: the state each piece starts from, over the earlier
  // ranks (in the recurrence's direction) that hold its sequence, from their carried-out summaries;
  // else (the backward's exit gradients) the dS each piece's end receives, over the later ranks, from
  // their carried-in summaries. with_source: each sequence's fold starts from its row of h0 (or of
  // d final_state).
  std::vector<FoldRow> fold_rows(bool entry, bool with_source) const {
    const std::vector<int>& walk = entry ? order : reverse_order;
    const int at = entry ? position(rank) : P - 1 - position(rank);  // this rank's place in `walk`
    std::vector<FoldRow> rows;
    const auto& pieces = mine().pieces;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(pieces.size()); ++i) {
      FoldRow row;
      const std::int64_t n = pieces[i].sequence;
      row.source = with_source ? n : -1;
      row.summary = packed ? (entry ? 0 : 1) : n;
      if (entry ? carried_in(i) : carried_out(i)) {
        int p = at;
        while (p > 0 && holds(walk[p - 1], n)) --p;
        row.first = p;
        row.count = at - p;
      }
      rows.push_back(row);
    }
    return rows;
  }
};

Layout make_layout(const std::vector<Descriptor>& all, int rank, const std::vector<std::int64_t>& offsets) {
  Layout L;
  L.P = static_cast<int>(all.size());
  L.rank = rank;
  const Descriptor& d = all[0];
  L.packed = d.values[Descriptor::packed] != 0;
  L.reverse = d.values[Descriptor::reverse] != 0;
  L.B = d.values[Descriptor::batch];
  L.N = d.values[Descriptor::sequences];
  L.R = L.packed ? 2 : L.B;
  for (int j = 0; j < L.P; ++j) L.order.push_back(L.reverse ? L.P - 1 - j : j);
  L.reverse_order.assign(L.order.rbegin(), L.order.rend());
  L.ranks.resize(static_cast<std::size_t>(L.P));
  if (!L.packed) {
    for (int j = 0; j < L.P; ++j)
      for (std::int64_t b = 0; b < L.B; ++b) L.ranks[j].pieces.push_back({0, all[j].values[Descriptor::tokens], b});
    return L;
  }
  L.offsets = offsets;
  L.starts.assign(1, 0);
  for (int j = 0; j < L.P; ++j) L.starts.push_back(L.starts.back() + all[j].values[Descriptor::tokens]);
  const std::int64_t total = L.starts.back();
  for (std::int64_t n = 0; n < L.N; ++n) {
    const std::int64_t bos = offsets[n], eos = offsets[n + 1];
    for (int j = 0; j < L.P; ++j) {
      const std::int64_t a = L.starts[j], e = L.starts[j + 1];
      // An empty sequence belongs to the rank whose slice holds its position (the last rank at the end).
      const bool empty_here = bos == eos && (bos >= a && (bos < e || (j == L.P - 1 && bos == total)));
      if (!(bos < e && eos > a) && !empty_here) continue;
      RankPieces& rp = L.ranks[j];
      Piece piece{std::max(bos, a) - a, std::min(eos, e) - a, n};
      const std::int64_t index = static_cast<std::int64_t>(rp.pieces.size());
      rp.pieces.push_back(piece);
      const bool from_before = bos < a, goes_after = eos > e;
      if (!L.reverse) {
        if (from_before) rp.in = index;
        if (goes_after) rp.out = index;
      } else {
        if (goes_after) rp.in = index;
        if (from_before) rp.out = index;
      }
    }
  }
  return L;
}

// ---- The call's pieces as run_variant takes them ------------------------------------------------

bool is_token_input(ir::InputKind kind) {
  return kind == ir::InputKind::token_key || kind == ir::InputKind::token_value || kind == ir::InputKind::token_head;
}
int canonical_rank(ir::InputKind kind) { return kind == ir::InputKind::token_head ? 3 : 4; }

// q, k, v and the per-token inputs with a batch axis (packed calls may drop it).
struct Canonical {
  TensorView q, k, v;
  VariantInputs inputs;
};
Canonical canonical(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                    const VariantInputs& inputs) {
  Canonical c{ops::detail::lead_with_ones(q, 4), ops::detail::lead_with_ones(k, 4), ops::detail::lead_with_ones(v, 4), inputs};
  for (const ir::Input& in : variant.inputs) {
    auto found = c.inputs.tensors.find(in.name);
    if (found != c.inputs.tensors.end() && is_token_input(in.kind) && q.rank() == 3)
      found->second = ops::detail::lead_with_ones(found->second, canonical_rank(in.kind));
  }
  return c;
}

// Every tensor a call reads or writes, where the group's buffers are.
void require_location(const std::string& op, const Communicator& group, const std::vector<std::pair<std::string, const TensorView*>>& views) {
  const Location where = group.location();
  for (const auto& [name, view] : views) {
    if (!view || view->data == nullptr) continue;
    if (name == "cu_seqlens") continue;  // read on the host, wherever it is
    if (view->location != where)
      throw InvalidArgument(fmt::format("{}: {} is {}, expected memory on {} (where the communicator, {}, exchanges its buffers)", op,
                                        name, describe(*view), to_string(where), group.describe()));
  }
}

std::vector<std::int64_t> host_offsets(const std::string& op, const TensorView& cu, const Stream* stream) {
  Tensor host = cu.on_device() ? Tensor::copy_of(cu, Location::host(), stream) : Tensor::copy_of(cu, Location::host());
  const ops::detail::Checker check(op);
  const TensorView view = host.view();
  if (view.rank() != 1 || view.shape[0] < 1) check.fail("cu_seqlens has shape " + ops::detail::shape_text(view.shape) + ", expected [N+1]");
  std::int64_t end = ops::detail::integer_at(view, view.shape[0] - 1);
  return ops::detail::read_offsets(check, "cu_seqlens", view, end, "cu_seqlens[N]");
}

// What a rank knows about its own call before any exchange.
// The local call's tensors as the caller gave them (packed: rank 3 where q was), for run_variant.
struct LocalArgs {
  TensorView q, k, v;
  VariantInputs inputs;
};

struct Call {
  std::string op;
  LocalArgs given;  // as the caller gave them
  Canonical c;
  ops::BoundInputs bound;   // the canonical local call, bound without states or cu_seqlens
  ops::RecurrentDims dims;  // of the canonical local call (B = 1 when packed), N the whole call's
  std::vector<std::int64_t> offsets;  // the whole call's cu_seqlens
  bool device = false;
  const Stream* stream = nullptr;
};

Descriptor describe_call(Call& call, const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                         const VariantInputs& inputs, const RunOptions& options, Communicator& group,
                         const std::function<void(const Call&)>& more_checks) {
  Descriptor d;
  try {
    if (variant.normalize)
      throw InvalidArgument(call.op + ": a normalised read is not context parallel yet (its normaliser would be folded beside the state)");
    std::vector<std::pair<std::string, const TensorView*>> views{{"q", &q}, {"k", &k}, {"v", &v}};
    for (const auto& [name, view] : inputs.tensors) views.push_back({name, &view});
    if (options.initial_state) views.push_back({"initial_state", &*options.initial_state});
    require_location(call.op, group, views);
    call.device = group.location().is_device();
    call.stream = options.gpu.stream;
    if (q.rank() == 3 && !options.cu_seqlens)
      throw InvalidArgument(call.op + ": q has shape " + ops::detail::shape_text(q.shape) + ", expected [B,T,H,K] (packed [T,H,K] takes cu_seqlens)");
    call.c = canonical(variant, q, k, v, inputs);
    RunOptions plain = options;
    plain.initial_state.reset(), plain.cu_seqlens.reset(), plain.return_state = false;
    plain.backend = call.device ? Backend::gpu : Backend::cpu;
    call.given = {q, k, v, inputs};
    call.bound = ops::bind_inputs(call.op, variant, call.c.q, call.c.k, call.c.v, call.c.inputs, plain);
    call.dims = call.bound.dims;
    if (options.cu_seqlens) {
      if (call.dims.B != 1)
        throw InvalidArgument(fmt::format("{}: with cu_seqlens the batch is 1, but q has batch {}", call.op, call.dims.B));
      call.offsets = host_offsets(call.op, *options.cu_seqlens, call.stream);
      call.dims.N = static_cast<std::int64_t>(call.offsets.size()) - 1;
    } else {
      call.dims.N = call.dims.B;
    }
    if (options.initial_state) {
      const TensorView& h0 = *options.initial_state;
      const std::vector<std::int64_t> want{call.dims.N, call.dims.H, call.dims.K, call.dims.V};
      if (h0.shape != want)
        throw InvalidArgument(fmt::format("{}: initial_state has shape {}, expected the whole call's [N,H,K,V] = {}", call.op,
                                          ops::detail::shape_text(h0.shape), ops::detail::shape_text(want)));
      if (!h0.is_contiguous() || (h0.type != DType::f32 && h0.type != DType::bf16 && h0.type != DType::f16))
        throw InvalidArgument(fmt::format("{}: initial_state is {}, expected a contiguous f32, bf16 or f16 tensor", call.op, describe(h0)));
    }
    if (more_checks) more_checks(call);
    std::uint64_t offsets_hash = 0;
    for (std::int64_t x : call.offsets) offsets_hash = mix(offsets_hash, static_cast<std::uint64_t>(x));
    d.values[Descriptor::variant_hash] = static_cast<std::int64_t>(ir::hash(variant));
    d.values[Descriptor::dtype] = static_cast<std::int64_t>(call.dims.type);
    d.values[Descriptor::batch] = call.dims.B;
    d.values[Descriptor::tokens] = call.dims.T;
    d.values[Descriptor::heads] = call.dims.H;
    d.values[Descriptor::kv_heads] = call.dims.H_kv;
    d.values[Descriptor::key_dim] = call.dims.K;
    d.values[Descriptor::value_dim] = call.dims.V;
    d.values[Descriptor::sequences] = call.dims.N;
    d.values[Descriptor::reverse] = options.reverse;
    d.values[Descriptor::has_initial_state] = options.initial_state.has_value();
    d.values[Descriptor::return_state] = options.return_state;
    d.values[Descriptor::packed] = options.cu_seqlens.has_value();
    d.values[Descriptor::offsets_hash] = static_cast<std::int64_t>(offsets_hash);
    d.values[Descriptor::offsets_total] = call.offsets.empty() ? 0 : call.offsets.back();
    d.values[Descriptor::location] = call.device ? 1 : 0;
    d.values[Descriptor::scalars_hash] = scalars_hash(inputs);
  } catch (const Error& e) {
    d.values[Descriptor::status] = 1;
    std::snprintf(d.message, sizeof d.message, "%s", e.what());
  }
  return d;
}

// ---- Summaries, the fold, and the local call ----------------------------------------------------

std::int64_t state_size(const ops::RecurrentDims& dims) { return dims.H * dims.K * dims.V; }

// How a rank's summary carries its transition: the segmented state pass's log2 decays [R][H][DL] (a
// diagonal decay on the GPU: every variant context parallelism takes runs the chunked family there), a
// diagonal decay's factors [R][H][K][V] from a run of the slice (the CPU), or a matrix [R][H][K][K]
// (the update forms: S_after = M S_before + L).
enum class Transition { log2_decays, factors, matrix };
Transition transition_of(const ir::Variant& variant, const Call& call) {
  if (variant.update != ir::Update::additive) return Transition::matrix;
  return call.device ? Transition::log2_decays : Transition::factors;
}

// Per rank, one buffer of floats: R state rows [R][H][K][V], then the transitions.
struct Summaries {
  Tensor mine, all;  // [floats], [P * floats]
  Transition kind = Transition::factors;
  std::int64_t floats = 0, decay_width = 0, key_width = 0;  // log2_decays: DL and its key part
  bool value_gate = false;
};

// The summaries' sizes and layout for this call (mine and all not yet allocated).
Summaries layout_of(const ir::Variant& variant, const Call& call, const Layout& L) {
  Summaries s;
  s.kind = transition_of(variant, call);
  s.value_gate = variant.has(ir::Slot::log_decay_v);
  const std::int64_t H = call.dims.H, K = call.dims.K, V = call.dims.V;
  std::int64_t transitions = 0;
  switch (s.kind) {
    case Transition::log2_decays:
      s.decay_width = cuda::chunked_segment_decay_width(variant, K, V);
      s.key_width = s.decay_width - (s.value_gate ? V : 0);
      transitions = L.R * H * s.decay_width;
      break;
    case Transition::factors: transitions = L.R * H * K * V; break;
    case Transition::matrix: transitions = L.R * H * K * K; break;
  }
  s.floats = L.R * H * K * V + transitions;
  return s;
}

// The local call's options: its packed pieces, its initial states, the CPU or the GPU.
RunOptions local_options(const RunOptions& options, const Call& call, const Layout& L, std::optional<Tensor>& offsets_keep) {
  RunOptions local = options;
  local.backend = call.device ? Backend::gpu : Backend::cpu;
  local.initial_state.reset();
  local.cu_seqlens.reset();
  if (L.packed) {
    std::vector<std::int64_t> cu;
    for (const Piece& p : L.mine().pieces) cu.push_back(p.lo);
    cu.push_back(call.dims.T);
    offsets_keep.emplace(DType::i64, std::vector<std::int64_t>{static_cast<std::int64_t>(cu.size())});
    std::memcpy(offsets_keep->data(), cu.data(), cu.size() * sizeof(std::int64_t));
    local.cu_seqlens = offsets_keep->view();
  }
  return local;
}


Location where(const Call& call) { return call.device ? Location::device(0) : Location::host(); }

void zero(Tensor& t, const Call& call) {
  if (t.numel() == 0) return;
  if (call.device) fill_device_bytes(address(t.data()), t.bytes(), 0, call.stream);
  else std::memset(t.data(), 0, t.bytes());
}

struct FoldKernel {
  std::string name;
};

const gpu::detail::LoadedKernel<FoldKernel>& cp_kernel(const char* name) {
  const std::string arch = Device::get().properties().arch();
  return gpu::detail::loaded_kernel<FoldKernel>(std::string("context parallel|") + name, arch, [&](const std::string& target) {
    struct {
      FoldKernel kernel;
      CompiledProgram program;
    } compiled{{name}, gpu::detail::compile_named(cuda::context_parallel_source(), "ladle_context_parallel", target, 0)};
    return compiled;
  });
}

// Where a GPU fold reads its summaries: rank (or sub-segment) j's L rows at states + j stride, its D
// rows at decays + j decay_stride.
struct DeviceSummaries {
  std::uint64_t states = 0, decays = 0;
  long long stride = 0, decay_stride = 0;
  std::int64_t rows_per_rank = 1, decay_width = 0, key_width = 0;
  bool value_gate = false;
};

// How the fold kernels read their source rows (h0 or d final_state): 0 f32, 1 bf16, 2 f16.
int source_type(const std::optional<TensorView>& source) {
  return !source ? 0 : source->type == DType::bf16 ? 1 : source->type == DType::f16 ? 2 : 0;
}

// The fold's tables on the device (meta rows of 4, the order), kept alive until the stream has run.
struct FoldTables {
  DeviceBuffer meta, order;
};
FoldTables upload_tables(const std::vector<FoldRow>& rows, const std::vector<int>& order, const Stream* stream) {
  std::vector<long long> meta;
  for (const FoldRow& r : rows) meta.insert(meta.end(), {r.source, r.first, r.count, r.summary});
  FoldTables t{DeviceBuffer::on_stream(std::max<std::size_t>(8, meta.size() * 8), stream),
               DeviceBuffer::on_stream(std::max<std::size_t>(4, order.size() * 4), stream)};
  if (!meta.empty()) t.meta.copy_from_host(meta.data(), meta.size() * 8, 0, stream);
  if (!order.empty()) t.order.copy_from_host(order.data(), order.size() * 4, 0, stream);
  return t;
}

void launch_fold(const Call& call, const DeviceSummaries& in, const FoldTables& tables, std::int64_t rows,
                 const std::optional<TensorView>& source, std::uint64_t out) {
  const std::int64_t S = state_size(call.dims);
  if (rows == 0 || S == 0) return;
  KernelArgs packed;
  packed.add(in.states).add(in.stride).add(in.decays).add(in.decay_stride);
  packed.add(source ? address(source->data) : std::uint64_t{0}).add(source_type(source));
  packed.add(tables.meta.device_ptr()).add(tables.order.device_ptr()).add(out);
  packed.add(static_cast<int>(in.rows_per_rank)).add(static_cast<int>(call.dims.H)).add(static_cast<int>(call.dims.K)).add(static_cast<int>(call.dims.V));
  packed.add(static_cast<int>(in.decay_width)).add(static_cast<int>(in.key_width)).add(in.value_gate ? 1 : 0);
  cp_kernel(cuda::context_parallel_fold_kernel)
      .function->launch({static_cast<unsigned>((S + 255) / 256), static_cast<unsigned>(rows), 1}, {256, 1, 1}, packed, 0, call.stream);
}

void launch_sum_decays(const Call& call, const DeviceSummaries& in, const FoldTables& tables, std::int64_t rows, std::uint64_t out) {
  const std::int64_t width = call.dims.H * in.decay_width;
  if (rows == 0 || width == 0) return;
  KernelArgs packed;
  packed.add(in.decays).add(in.decay_stride).add(tables.meta.device_ptr()).add(tables.order.device_ptr()).add(out);
  packed.add(static_cast<int>(call.dims.H)).add(static_cast<int>(in.decay_width));
  cp_kernel(cuda::context_parallel_sum_kernel)
      .function->launch({static_cast<unsigned>((width + 255) / 256), static_cast<unsigned>(rows), 1}, {256, 1, 1}, packed, 0, call.stream);
}

// This rank's summaries of its carried pieces (rows: batch rows, or [carried out, carried in]).
Summaries summarise(const ir::Variant& variant, const Call& call, const Layout& L, const RunOptions& options) {
  const LocalArgs& args = call.given;
  Summaries s = layout_of(variant, call, L);
  const std::int64_t S = state_size(call.dims);
  s.mine = Tensor(DType::f32, {s.floats}, where(call), call.stream);
  zero(s.mine, call);
  const RankPieces& mine = L.mine();
  // The pieces summarised: batch rows whole, or the carried-out and carried-in pieces (a 1-token
  // stand-in where there is none: its summary is never folded).
  std::vector<Piece> rows;
  if (!L.packed) {
    rows = mine.pieces;
  } else {
    rows.push_back(mine.out >= 0 ? mine.pieces[mine.out] : Piece{0, 1, 0});
    rows.push_back(mine.in >= 0 ? mine.pieces[mine.in] : Piece{0, 1, 0});
  }
  if (s.kind == Transition::log2_decays) {
    // Each piece in m sub-segments (in the recurrence's direction), so that the state pass's blocks
    // cover the GPU: m = 1 leaves one serial walk over the whole slice to H blocks a row.
    std::int64_t shortest = -1;  // the real rows' (a stand-in row takes m single tokens)
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (!L.packed || (i == 0 ? mine.out : mine.in) >= 0)
        shortest = shortest < 0 ? rows[i].hi - rows[i].lo : std::min(shortest, rows[i].hi - rows[i].lo);
    const std::int64_t sms = Device::get().properties().sm_count;
    const std::int64_t wanted = (4 * sms + L.R * call.dims.H - 1) / std::max<std::int64_t>(1, L.R * call.dims.H);
    const std::int64_t m = std::clamp<std::int64_t>(wanted, 1, std::max<std::int64_t>(1, shortest / 1024));
    if (L.packed)
      for (std::size_t i = 0; i < rows.size(); ++i)
        if ((i == 0 ? mine.out : mine.in) < 0) rows[i] = Piece{0, m, 0};
    cuda::ChunkedSegments segments;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const long long b = L.packed ? 0 : rows[i].sequence;
      const std::int64_t length = rows[i].hi - rows[i].lo, each = (length + m - 1) / m;
      for (std::int64_t k = 0; k < m; ++k) {
        // Sub-segment k in the recurrence's direction.
        const std::int64_t lo = L.reverse ? std::max(rows[i].lo, rows[i].hi - (k + 1) * each) : std::min(rows[i].hi, rows[i].lo + k * each);
        const std::int64_t hi = L.reverse ? std::max(rows[i].lo, rows[i].hi - k * each) : std::min(rows[i].hi, rows[i].lo + (k + 1) * each);
        const long long r = static_cast<long long>(i * m + k);
        const long long row[8] = {b, lo, hi, r, 0, r, 0, 0};
        segments.earlier.insert(segments.earlier.end(), row, row + 8);
        const long long last[8] = {b, lo, hi, r, 0, r, 1, 0};
        segments.all.insert(segments.all.end(), last, last + 8);
      }
    }
    RunOptions plain = options;
    plain.initial_state.reset(), plain.cu_seqlens.reset(), plain.return_state = false;
    plain.algorithm = Algorithm::chunked;
    const std::uint64_t base = address(s.mine.data());
    if (m == 1) {
      gpu::run_segment_summaries(variant, call.c.q, call.c.k, call.c.v, call.c.inputs, plain, segments, base,
                                 base + static_cast<std::uint64_t>(L.R * S) * 4, {call.stream});
      return s;
    }
    const std::int64_t parts = L.R * m;
    DeviceBuffer part_states = DeviceBuffer::on_stream(static_cast<std::size_t>(parts * S) * 4, call.stream);
    DeviceBuffer part_decays = DeviceBuffer::on_stream(std::max<std::size_t>(4, static_cast<std::size_t>(parts * call.dims.H * s.decay_width) * 4), call.stream);
    gpu::run_segment_summaries(variant, call.c.q, call.c.k, call.c.v, call.c.inputs, plain, segments, part_states.device_ptr(),
                               part_decays.device_ptr(), {call.stream});
    // Row i's summary = the fold of its sub-segments from zero, and the sum of their decays.
    std::vector<FoldRow> chains;
    std::vector<int> order(static_cast<std::size_t>(parts));
    std::iota(order.begin(), order.end(), 0);
    for (std::int64_t i = 0; i < L.R; ++i) chains.push_back({-1, i * m, m, 0});
    const FoldTables tables = upload_tables(chains, order, call.stream);
    DeviceSummaries in;
    in.states = part_states.device_ptr(), in.decays = part_decays.device_ptr();
    in.stride = S, in.decay_stride = call.dims.H * s.decay_width;
    in.rows_per_rank = 1, in.decay_width = s.decay_width, in.key_width = s.key_width, in.value_gate = s.value_gate;
    launch_fold(call, in, tables, L.R, std::nullopt, base);
    launch_sum_decays(call, in, tables, L.R, base + static_cast<std::uint64_t>(L.R * S) * 4);
    return s;
  }
  // By runs of the slice (the CPU; on the GPU the update forms): the pieces' own final states from
  // zero, and their transitions: for a diagonal decay from a run with zero k and v from a state of
  // ones (each factor a product of the decays, nothing added), for the update forms from a run with
  // zero v (K columns) from the identity, whose final state is M itself.
  std::optional<Tensor> keep;
  RunOptions local = local_options(options, call, L, keep);
  local.return_state = true;
  const std::int64_t NL = static_cast<std::int64_t>(mine.pieces.size()), H = call.dims.H, K = call.dims.K;
  const bool matrix = s.kind == Transition::matrix;
  const std::int64_t T_cols = matrix ? K : call.dims.V, TS = H * K * T_cols;  // a transition row's columns and floats
  const Location at = where(call);
  const auto o_like = [&](std::int64_t cols) {
    auto shape = args.q.shape;
    shape.back() = cols, shape[shape.size() - 2] = H;
    return Tensor(args.q.type, shape, at, call.stream);
  };
  const auto host_to = [&](const Tensor& t) { return at.is_device() ? t.to(at, call.stream) : t; };
  Tensor o = o_like(call.dims.V), own(DType::f32, {NL, H, K, call.dims.V}, at, call.stream);
  ladle::run_variant_into(variant, args.q, args.k, args.v, args.inputs, local, {o.view(), own.view()});
  Tensor start(DType::f32, {NL, H, K, T_cols}, 0.0f), factors(DType::f32, {NL, H, K, T_cols}, at, call.stream);
  for (std::int64_t r = 0; r < NL * H; ++r)
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t c = 0; c < T_cols; ++c) start.set((r * K + i) * T_cols + c, matrix ? (i == c ? 1.0f : 0.0f) : 1.0f);
  const Tensor device_start = host_to(start);
  local.initial_state = device_start.view();
  std::vector<std::int64_t> v_shape = args.v.shape;
  v_shape.back() = T_cols;
  const Tensor zero_v = host_to(Tensor(args.v.type, v_shape, 0.0f));
  const Tensor zero_k = matrix ? Tensor() : host_to(Tensor(args.k.type, args.k.shape, 0.0f));
  Tensor o_t = o_like(T_cols);
  ladle::run_variant_into(variant, args.q, matrix ? args.k : zero_k.view(), zero_v.view(), args.inputs, local, {o_t.view(), factors.view()});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    // The local piece of this row: batch row i, or the carried piece's index.
    const std::int64_t piece = !L.packed ? static_cast<std::int64_t>(i) : (i == 0 ? mine.out : mine.in);
    if (piece < 0) continue;
    auto* out = static_cast<std::byte*>(s.mine.data());
    const auto copy = [&](std::size_t to, const void* from, std::size_t bytes) {
      if (at.is_device()) copy_device_to_device(address(out + to), address(from), bytes, call.stream);
      else std::memcpy(out + to, from, bytes);
    };
    copy(static_cast<std::size_t>(i * S) * 4, static_cast<const float*>(own.data()) + piece * S, static_cast<std::size_t>(S) * 4);
    copy(static_cast<std::size_t>(L.R * S + static_cast<std::int64_t>(i) * TS) * 4, static_cast<const float*>(factors.data()) + piece * TS,
         static_cast<std::size_t>(TS) * 4);
  }
  if (at.is_device()) {  // the runs' tensors are freed on return
    if (call.stream) call.stream->synchronize();
    else Device::get().synchronize();
  }
  return s;
}

void gather(Communicator& group, Summaries& s, const Call& call) {
  s.all = Tensor(DType::f32, {s.floats * group.size()}, where(call), call.stream);
  group.all_gather(s.mine.data(), s.all.data(), static_cast<std::size_t>(s.floats) * 4, call.stream);
}


// out [rows.size()][H][K][V] f32: each row's fold over the gathered summaries (see FoldRow), from
// `source` rows (initial_state or d_final_state; absent: zero).
Tensor fold(const Call& call, const Layout& L, const Summaries& s, const std::vector<FoldRow>& rows, const std::vector<int>& order,
            const std::optional<TensorView>& source, Tensor given = Tensor(), bool transpose = false) {
  const bool matrix = s.kind == Transition::matrix;
  const std::int64_t S = state_size(call.dims), NL = static_cast<std::int64_t>(rows.size());
  Tensor out = given.numel() > 0 ? std::move(given) : Tensor(DType::f32, {NL, call.dims.H, call.dims.K, call.dims.V}, where(call), call.stream);
  if (NL == 0 || S == 0) return out;
  if (call.device && matrix) {
    const FoldTables tables = upload_tables(rows, order, call.stream);
    const std::uint64_t all = address(s.all.data());
    KernelArgs packed;
    packed.add(all).add(static_cast<long long>(s.floats)).add(all + static_cast<std::uint64_t>(L.R * S) * 4);
    packed.add(source ? address(source->data) : std::uint64_t{0}).add(source_type(source));
    packed.add(tables.meta.device_ptr()).add(tables.order.device_ptr()).add(address(out.data()));
    packed.add(static_cast<int>(L.R)).add(static_cast<int>(call.dims.H)).add(static_cast<int>(call.dims.K)).add(static_cast<int>(call.dims.V));
    packed.add(transpose ? 1 : 0);
    cp_kernel(cuda::context_parallel_matrix_fold_kernel)
        .function->launch({static_cast<unsigned>((call.dims.V + 31) / 32), static_cast<unsigned>(NL), static_cast<unsigned>(call.dims.H)},
                          {256, 1, 1}, packed, static_cast<unsigned>(call.dims.K * 32 * 4), call.stream);
    return out;
  }
  if (call.device) {
    const FoldTables tables = upload_tables(rows, order, call.stream);
    DeviceSummaries in;
    in.states = address(s.all.data()), in.decays = in.states + static_cast<std::uint64_t>(L.R * S) * 4;
    in.stride = in.decay_stride = s.floats;
    in.rows_per_rank = L.R, in.decay_width = s.decay_width, in.key_width = s.key_width, in.value_gate = s.value_gate;
    launch_fold(call, in, tables, NL, source, address(out.data()));
    return out;
  }
  const auto* all = static_cast<const float*>(s.all.data());
  auto* o = static_cast<float*>(out.data());
  if (matrix) {  // S = M S + L per head (M^T for the backward's dS)
    const std::int64_t H = call.dims.H, K = call.dims.K, V = call.dims.V;
    std::vector<float> x(static_cast<std::size_t>(S)), next(static_cast<std::size_t>(S));
    for (std::int64_t n = 0; n < NL; ++n) {
      const FoldRow& r = rows[n];
      for (std::int64_t i = 0; i < S; ++i)
        x[i] = r.source >= 0 && source
                   ? load_float(static_cast<const std::byte*>(source->data) + (r.source * S + i) * dtype_size(source->type), source->type)
                   : 0.0f;
      for (std::int64_t c = r.first; c < r.first + r.count; ++c) {
        const float* rank = all + order[c] * s.floats;
        for (std::int64_t h = 0; h < H; ++h) {
          const float* M = rank + L.R * S + (r.summary * H + h) * K * K;
          const float* Ls = rank + r.summary * S + h * K * V;
          for (std::int64_t i = 0; i < K; ++i)
            for (std::int64_t v = 0; v < V; ++v) {
              float acc = Ls[i * V + v];
              for (std::int64_t k = 0; k < K; ++k) acc += (transpose ? M[k * K + i] : M[i * K + k]) * x[h * K * V + k * V + v];
              next[h * K * V + i * V + v] = acc;
            }
        }
        x.swap(next);
      }
      std::copy(x.begin(), x.end(), o + n * S);
    }
    return out;
  }
  for (std::int64_t n = 0; n < NL; ++n) {
    const FoldRow& r = rows[n];
    for (std::int64_t i = 0; i < S; ++i) {
      float x = 0.0f;
      if (r.source >= 0 && source)
        x = load_float(static_cast<const std::byte*>(source->data) + (r.source * S + i) * dtype_size(source->type), source->type);
      for (std::int64_t c = r.first; c < r.first + r.count; ++c) {
        const float* rank = all + order[c] * s.floats;
        x = rank[L.R * S + r.summary * S + i] * x + rank[r.summary * S + i];
      }
      o[n * S + i] = x;
    }
  }
  return out;
}

// Rows `rows` of `local` ([NL][H][K][V] f32) into their sequences' rows of `whole` ([N][H][K][V] f32,
// zeroed first), then summed over the ranks: each sequence's row comes from the one rank that holds it.
void assemble(Communicator& group, const Call& call, const Layout& L, const Tensor& local, const std::vector<bool>& owned,
              const TensorView& whole) {
  const std::int64_t S = state_size(call.dims);
  const std::size_t row = static_cast<std::size_t>(S) * 4, bytes = static_cast<std::size_t>(L.N) * row;
  if (call.device) fill_device_bytes(address(whole.data), bytes, 0, call.stream);
  else std::memset(whole.data, 0, bytes);
  const auto& pieces = L.mine().pieces;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (!owned[i]) continue;
    auto* to = static_cast<std::byte*>(whole.data) + pieces[i].sequence * row;
    const auto* from = static_cast<const std::byte*>(local.data()) + i * row;
    if (call.device) copy_device_to_device(address(to), address(from), row, call.stream);
    else std::memcpy(to, from, row);
  }
  group.all_sum(static_cast<float*>(whole.data), static_cast<std::size_t>(L.N * S), call.stream);
}


// LADLE_CP_PHASES=1: each phase's wall time on stderr, the stream waited for after each (a
// measurement knob: the waits cost the overlap a call otherwise has).
class Phases {
 public:
  explicit Phases(const Call& call) : call_(call), on_(enabled()), last_(std::chrono::steady_clock::now()) {}
  void mark(const char* what) {
    if (!on_) return;
    if (call_.device) {
      if (call_.stream) call_.stream->synchronize();
      else Device::get().synchronize();
    }
    const auto now = std::chrono::steady_clock::now();
    std::fprintf(stderr, "%s: %s %.3f ms\n", call_.op.c_str(), what, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }

 private:
  static bool enabled() {
    static const bool on = [] {
      const char* v = std::getenv("LADLE_CP_PHASES");
      return v && std::string(v) == "1";
    }();
    return on;
  }
  const Call& call_;
  bool on_;
  std::chrono::steady_clock::time_point last_;
};

// The shared first half of both directions: descriptors, layout, summaries, the entry states.
struct Prepared {
  Call call;
  Layout layout;
  Summaries summaries;
  Tensor entry;  // [NL][H][K][V] f32: the state each local piece starts from
  std::optional<Tensor> offsets_keep;
  RunOptions local;
};

// The exchange of the ranks' verdicts and sizes, the layout, and the local call's options.
Prepared begin(const char* what, const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
               const VariantInputs& inputs, const RunOptions& options, Communicator& group,
               const std::function<void(const Call&)>& more_checks) {
  Prepared p;
  p.call.op = op_name(variant, what);
  const Descriptor mine = describe_call(p.call, variant, q, k, v, inputs, options, group, more_checks);
  Phases phases(p.call);
  const std::vector<Descriptor> all = exchange(p.call.op, group, mine, options.gpu.stream);
  phases.mark("exchange");
  p.layout = make_layout(all, group.rank(), p.call.offsets);
  p.local = local_options(options, p.call, p.layout, p.offsets_keep);
  return p;
}

// The entry states by a pass of their own: summaries, the all-gather, the fold (into `into`, where given).
void entry_states(Prepared& p, const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                  const VariantInputs& inputs, const RunOptions& options, Communicator& group, Tensor into = Tensor()) {
  Phases phases(p.call);
  if (p.layout.P > 1) {
    p.summaries = summarise(variant, p.call, p.layout, options);
    phases.mark("summaries");
    gather(group, p.summaries, p.call);
    phases.mark("all-gather");
  }
  p.entry = fold(p.call, p.layout, p.summaries, p.layout.fold_rows(true, options.initial_state.has_value()), p.layout.order,
                 options.initial_state, std::move(into));
  phases.mark("fold");
  p.local.initial_state = p.entry.view();
}

Prepared prepare(const char* what, const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                 const VariantInputs& inputs, const RunOptions& options, Communicator& group,
                 const std::function<void(const Call&)>& more_checks) {
  Prepared p = begin(what, variant, q, k, v, inputs, options, group, more_checks);
  entry_states(p, variant, q, k, v, inputs, options, group);
  return p;
}

// The GPU forward of a slice in one pass where it runs the chunked segmented form: the slice's own
// state pass gives the summaries (gpu::run_variant_with_summaries), so k, v and the gates are read
// for them once, not twice. False where the call runs another form (nothing launched).
bool fused_forward(Prepared& p, const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                   const VariantInputs& inputs, const RunOptions& options, Communicator& group, const RecurrentOutputs& local_outputs) {
  const Call& call = p.call;
  const Layout& L = p.layout;
  const std::int64_t S = state_size(call.dims), NL = static_cast<std::int64_t>(L.mine().pieces.size());
  Tensor entry(DType::f32, {NL, call.dims.H, call.dims.K, call.dims.V}, where(call), call.stream);
  RunOptions local = p.local;
  local.initial_state = entry.view();
  Summaries& s = p.summaries;
  s = layout_of(variant, call, L);
  Phases phases(call);
  const gpu::SegmentSummariesHook hook = [&](std::uint64_t states, std::uint64_t decays, const std::vector<std::vector<long long>>& chains) {
    // Summary row i: the fold of its piece's segments from zero, and their decays' sum.
    s.mine = Tensor(DType::f32, {s.floats}, where(call), call.stream);
    zero(s.mine, call);
    std::vector<FoldRow> rows;
    std::vector<int> order;
    for (std::int64_t i = 0; i < L.R; ++i) {
      const std::int64_t piece = !L.packed ? i : (i == 0 ? L.mine().out : L.mine().in);
      FoldRow row{-1, static_cast<std::int64_t>(order.size()), 0, 0};
      if (piece >= 0)
        for (const long long r : chains[static_cast<std::size_t>(piece)]) order.push_back(static_cast<int>(r)), ++row.count;
      rows.push_back(row);
    }
    const FoldTables tables = upload_tables(rows, order, call.stream);
    DeviceSummaries in;
    in.states = states, in.decays = decays, in.stride = S, in.decay_stride = call.dims.H * s.decay_width;
    in.rows_per_rank = 1, in.decay_width = s.decay_width, in.key_width = s.key_width, in.value_gate = s.value_gate;
    const std::uint64_t base = address(s.mine.data());
    launch_fold(call, in, tables, L.R, std::nullopt, base);
    launch_sum_decays(call, in, tables, L.R, base + static_cast<std::uint64_t>(L.R * S) * 4);
    phases.mark("summaries (the slice's own state pass)");
    gather(group, s, call);
    phases.mark("all-gather");
    p.entry = fold(call, L, s, L.fold_rows(true, options.initial_state.has_value()), L.order, options.initial_state, std::move(entry));
    phases.mark("fold");
  };
  const bool ran = gpu::run_variant_with_summaries(variant, q, k, v, inputs, local, local_outputs, hook, {call.stream});
  if (ran) phases.mark("the slice's forward (the rest)");
  return ran;
}

}  // namespace

void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                      const VariantInputs& inputs, const RunOptions& options, const RecurrentOutputs& outputs,
                      Communicator& group) {
  Prepared p = begin("forward", variant, q, k, v, inputs, options, group, [&](const Call& call) {
    require_location(call.op, group, {{"o", &outputs.o}});
    if (options.return_state && !outputs.final_state)
      throw InvalidArgument(call.op + ": options.return_state is set but outputs.final_state is not given");
    if (outputs.final_state) {
      require_location(call.op, group, {{"final_state", &*outputs.final_state}});
      const std::vector<std::int64_t> want{call.dims.N, call.dims.H, call.dims.K, call.dims.V};
      if (outputs.final_state->shape != want || outputs.final_state->type != DType::f32 || !outputs.final_state->is_contiguous())
        throw InvalidArgument(fmt::format("{}: final_state is {}, expected contiguous f32 {} (the whole call's)", call.op,
                                          describe(*outputs.final_state), ops::detail::shape_text(want)));
    }
    // o as the local call takes it (checked here, before any exchange).
    ops::BoundInputs bound = call.bound;
    ops::bind_outputs(call.op, {}, {ops::detail::lead_with_ones(outputs.o, 4), std::nullopt}, bound);
  });
  const std::int64_t NL = static_cast<std::int64_t>(p.layout.mine().pieces.size());
  std::optional<Tensor> local_final;
  if (outputs.final_state) {
    local_final.emplace(DType::f32, std::vector<std::int64_t>{NL, p.call.dims.H, p.call.dims.K, p.call.dims.V}, where(p.call), p.call.stream);
    p.local.return_state = true;
  } else {
    p.local.return_state = false;
  }
  const RecurrentOutputs local_outputs{outputs.o, local_final ? std::optional<TensorView>(local_final->view()) : std::nullopt};
  if (!(p.call.device && p.layout.P > 1 && transition_of(variant, p.call) == Transition::log2_decays && fused_forward(p, variant, q, k, v, inputs, options, group, local_outputs))) {
    entry_states(p, variant, q, k, v, inputs, options, group);
    Phases phases(p.call);
    ladle::run_variant_into(variant, q, k, v, inputs, p.local, local_outputs);
    phases.mark("the slice's forward");
  }
  if (outputs.final_state) {
    std::vector<bool> owned(static_cast<std::size_t>(NL));
    for (std::int64_t i = 0; i < NL; ++i) owned[i] = !p.layout.carried_out(i);
    assemble(group, p.call, p.layout, *local_final, owned, *outputs.final_state);
  }
}

RecurrentResult run_variant(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                            const VariantInputs& inputs, const RunOptions& options, Communicator& group) {
  const Location at = q.location;
  const std::int64_t V = v.shape.empty() ? 0 : v.shape.back();
  std::vector<std::int64_t> shape = q.shape;
  // o takes q's layout with V features and the recurrence's heads (v's with grouped value heads).
  if (shape.size() >= 2) {
    shape.back() = V;
    const std::int64_t qh = q.shape[q.shape.size() - 2], vh = v.shape.size() >= 2 ? v.shape[v.shape.size() - 2] : qh;
    shape[shape.size() - 2] = std::max(qh, vh);
  }
  RecurrentResult result;
  result.o = at.is_device() ? Tensor(q.type, shape, at, options.gpu.stream) : Tensor(q.type, shape);
  std::optional<TensorView> final_view;
  if (options.return_state) {
    const std::int64_t N = options.cu_seqlens ? options.cu_seqlens->shape.at(0) - 1 : q.shape.at(0);
    const std::int64_t H = shape.size() >= 2 ? shape[shape.size() - 2] : 0;
    const std::int64_t K = q.shape.empty() ? 0 : q.shape.back();
    result.final_state = at.is_device() ? Tensor(DType::f32, {N, H, K, V}, at, options.gpu.stream) : Tensor(DType::f32, {N, H, K, V});
    final_view = result.final_state->view();
  }
  run_variant_into(variant, q, k, v, inputs, options, {result.o.view(), final_view}, group);
  return result;
}

void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients,
                               Communicator& group) {
  Prepared p = prepare("backward", variant, q, k, v, inputs, options, group, [&](const Call& call) {
    std::vector<std::pair<std::string, const TensorView*>> views{{"d_output", &d_output}, {"dq", &gradients.dq}, {"dk", &gradients.dk},
                                                                 {"dv", &gradients.dv}};
    if (d_final_state) views.push_back({"d_final_state", &*d_final_state});
    if (gradients.d_initial_state) views.push_back({"d_initial_state", &*gradients.d_initial_state});
    for (const auto& [name, view] : gradients.inputs) views.push_back({"the gradient of " + name, &view});
    require_location(call.op, group, views);
    const std::vector<std::int64_t> state{call.dims.N, call.dims.H, call.dims.K, call.dims.V};
    if (d_final_state && d_final_state->shape != state)
      throw InvalidArgument(fmt::format("{}: d_final_state has shape {}, expected the whole call's [N,H,K,V] = {}", call.op,
                                        ops::detail::shape_text(d_final_state->shape), ops::detail::shape_text(state)));
    if (d_final_state && !d_final_state->is_contiguous())
      throw InvalidArgument(call.op + ": d_final_state must be contiguous");
    if (options.initial_state.has_value() != gradients.d_initial_state.has_value())
      throw InvalidArgument(call.op + (options.initial_state ? ": options.initial_state is given, so gradients.d_initial_state must be"
                                                             : ": gradients.d_initial_state is given without options.initial_state"));
    if (gradients.d_initial_state &&
        (gradients.d_initial_state->shape != state || gradients.d_initial_state->type != DType::f32 || !gradients.d_initial_state->is_contiguous()))
      throw InvalidArgument(fmt::format("{}: gradients.d_initial_state is {}, expected contiguous f32 {}", call.op,
                                        describe(*gradients.d_initial_state), ops::detail::shape_text(state)));
    const auto same_shape = [&](const char* name, const TensorView& grad, const TensorView& of) {
      if (grad.shape != of.shape || grad.type != DType::f32 || !grad.is_contiguous())
        throw InvalidArgument(fmt::format("{}: {} is {}, expected contiguous f32 {}", call.op, name, describe(grad),
                                          ops::detail::shape_text(of.shape)));
    };
    same_shape("dq", gradients.dq, q), same_shape("dk", gradients.dk, k), same_shape("dv", gradients.dv, v);
    for (const ir::Input& in : variant.inputs) {
      auto given = inputs.tensors.find(in.name);
      if (given == inputs.tensors.end()) continue;
      auto grad = gradients.inputs.find(in.name);
      if (grad == gradients.inputs.end())
        throw InvalidArgument(fmt::format("{}: gradients.inputs has no \"{}\", expected its gradient's view", call.op, in.name));
      same_shape(("the gradient of " + in.name).c_str(), grad->second, given->second);
    }
    ops::bind_backward(call.op, call.bound, ops::detail::lead_with_ones(d_output, 4), std::nullopt);
  });
  const Call& call = p.call;
  const Layout& L = p.layout;
  const std::int64_t NL = static_cast<std::int64_t>(L.mine().pieces.size()), S = state_size(call.dims);
  const std::vector<std::int64_t> local_state{NL, call.dims.H, call.dims.K, call.dims.V};
  // Scratch gradients for the first pass (and this rank's d initial_state of its pieces).
  const auto scratch_like = [&](const TensorView& of) { return Tensor(DType::f32, of.shape, where(call), call.stream); };
  Tensor local_d_initial(DType::f32, local_state, where(call), call.stream);
  Tensor exit;  // [NL][H][K][V]: the dS each piece's last token receives from later tokens
  if (L.P > 1) {
    // 1. Each rank's dL/d(entry state) of its carried-in pieces from its own tokens (d final state 0):
    // on the GPU dS's recurrence alone (gpu::run_initial_state_gradient), else a whole backward.
    Phases phases(p.call);
    if (call.device && variant.plain_form()) {
      gpu::run_initial_state_gradient(variant, q, k, v, inputs, p.local, d_output, std::nullopt, local_d_initial.view(), {call.stream});
    } else {
      Tensor sdq = scratch_like(q), sdk = scratch_like(k), sdv = scratch_like(v);
      std::map<std::string, Tensor> sinputs;
      RecurrentGradientViews first{sdq.view(), sdk.view(), sdv.view(), {}, local_d_initial.view()};
      for (const auto& [name, view] : inputs.tensors) {
        sinputs.emplace(name, scratch_like(view));
        first.inputs.emplace(name, sinputs.at(name).view());
      }
      ladle::run_variant_backward_into(variant, q, k, v, inputs, p.local, d_output, std::nullopt, first);
    }
    phases.mark("the slice's dS summary");
    // 2. Summaries: those dS rows, beside the transitions this rank already sent.
    Summaries d;
    d.kind = p.summaries.kind, d.floats = p.summaries.floats, d.decay_width = p.summaries.decay_width, d.key_width = p.summaries.key_width;
    d.value_gate = p.summaries.value_gate;
    d.mine = Tensor(DType::f32, {d.floats}, where(call), call.stream);
    zero(d.mine, call);
    const std::size_t row = static_cast<std::size_t>(S) * 4;
    const auto copy = [&](void* to, const void* from, std::size_t bytes) {
      if (call.device) copy_device_to_device(address(to), address(from), bytes, call.stream);
      else std::memcpy(to, from, bytes);
    };
    auto* dm = static_cast<std::byte*>(d.mine.data());
    const auto* sm = static_cast<const std::byte*>(p.summaries.mine.data());
    if (!L.packed) {
      copy(dm, local_d_initial.data(), L.B * row);
    } else if (L.mine().in >= 0) {
      copy(dm + row, static_cast<const std::byte*>(local_d_initial.data()) + L.mine().in * row, row);  // row 1: carried in
    }
    copy(dm + L.R * row, sm + L.R * row, static_cast<std::size_t>(d.floats - L.R * S) * 4);
    gather(group, d, call);
    // 3. The other way's fold: the dS entering each carried-out piece from the later ranks.
    exit = fold(call, L, d, L.fold_rows(false, d_final_state.has_value()), L.reverse_order, d_final_state, Tensor(), true);
  } else {
    exit = fold(call, L, p.summaries, L.fold_rows(false, d_final_state.has_value()), L.reverse_order, d_final_state, Tensor(), true);
  }
  // 4. The slice's backward from its entry states and exit gradients.
  RecurrentGradientViews local = gradients;
  local.d_initial_state = local_d_initial.view();
  Phases phases(p.call);
  ladle::run_variant_backward_into(variant, q, k, v, inputs, p.local, d_output, exit.view(), local);
  phases.mark("the slice's backward");
  // 5. What belongs to the whole call: d initial_state (from the rank holding each sequence's first
  // token) and per-head inputs' gradients (every rank's tokens add to them).
  if (gradients.d_initial_state) {
    std::vector<bool> owned(static_cast<std::size_t>(NL));
    for (std::int64_t i = 0; i < NL; ++i) owned[i] = !L.carried_in(i);
    assemble(group, call, L, local_d_initial, owned, *gradients.d_initial_state);
  }
  for (const ir::Input& in : variant.inputs) {
    if (is_token_input(in.kind) || in.kind == ir::InputKind::scalar) continue;
    auto grad = gradients.inputs.find(in.name);
    if (grad == gradients.inputs.end() || !inputs.tensors.count(in.name)) continue;
    group.all_sum(static_cast<float*>(grad->second.data), static_cast<std::size_t>(grad->second.numel()), call.stream);
  }
}

// ---- Causal softmax attention ----------------------------------------------------------------------

AttentionSlice attention_slice(std::int64_t tokens, int ranks, int rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw InvalidArgument(fmt::format("context_parallel::attention_slice: rank {} of {}, expected 0 <= rank < ranks", rank, ranks));
  if (tokens < 2 * ranks || tokens % (2 * ranks) != 0)
    throw InvalidArgument(fmt::format("context_parallel::attention_slice: tokens = {}, expected a multiple of 2 x ranks = {}", tokens,
                                      2 * ranks));
  const std::int64_t c = tokens / (2 * ranks);
  return {rank * c, (rank + 1) * c, (2 * ranks - 1 - rank) * c, (2 * ranks - rank) * c};
}

namespace {

std::string attention_op(const ir::AttentionVariant& variant, const char* what) {
  return fmt::format("{} context parallel {}", variant.name.empty() ? "attention" : variant.name, what);
}

bool uses_positions(const ir::Expr& e) {
  for (const ir::Node& n : e.nodes)
    if (n.op == ir::Op::query_index || n.op == ir::Op::key_index) return true;
  return false;
}

// Why the all-gather form cannot run this variant (empty: it can).
std::string attention_unsupported(const ir::AttentionVariant& variant, bool backward) {
  if (variant.dropout) return "dropout draws its keep mask from positions counted per call, not per sequence";
  if (variant.segment_ids) return "segment ids are per token of the keys: pass cu_seqlens-free calls without them";
  if (uses_positions(variant.score) || uses_positions(variant.keep))
    return "the score or keep expression reads query or key positions, which each chunk's call counts from its own start";
  for (const ir::Input& in : variant.inputs) {
    if (in.kind == ir::InputKind::pair) return "the pair input '" + in.name + "' ([B,H,Tq,Tk]) is not cut by ranks";
    if (backward && in.role == ir::Role::other && in.kind != ir::InputKind::scalar)
      return "the input '" + in.name + "' would need its gradient summed over the ranks (not built yet)";
  }
  if (backward && variant.sinks) return "the sinks' gradient would need summing over the ranks (not built yet)";
  return "";
}

struct AttentionCall {
  std::string op;
  bool device = false;
  const Stream* stream = nullptr;
  std::int64_t B = 0, local = 0, chunk = 0, H = 0, H_kv = 0, D = 0, Dv = 0;
  DType type = DType::f32;
  int P = 1, rank = 0;
};

// Checks, the exchange of verdicts, and the sizes. `more`: the direction's own checks.
AttentionCall attention_begin(const char* what, const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k,
                              const TensorView& v, const VariantInputs& inputs, const AttentionRunOptions& options,
                              Communicator& group, bool backward, const std::function<void(const AttentionCall&)>& more) {
  AttentionCall call;
  call.op = attention_op(variant, what);
  call.P = group.size(), call.rank = group.rank();
  Descriptor d;
  try {
    if (const std::string why = attention_unsupported(variant, backward); !why.empty())
      throw InvalidArgument(call.op + ": " + why);
    if (options.cu_seqlens_q || options.cu_seqlens_k)
      throw InvalidArgument(call.op + ": cu_seqlens: packed sequences are not context parallel for attention yet");
    std::vector<std::pair<std::string, const TensorView*>> views{{"q", &q}, {"k", &k}, {"v", &v}};
    for (const auto& [name, view] : inputs.tensors) views.push_back({name, &view});
    if (options.softmax_aux) views.push_back({"softmax_aux", &*options.softmax_aux});
    require_location(call.op, group, views);
    for (const auto& [name, view] : std::vector<std::pair<const char*, const TensorView*>>{{"q", &q}, {"k", &k}, {"v", &v}})
      if (view->rank() != 4)
        throw InvalidArgument(fmt::format("{}: {} has shape {}, expected [B,T,H,D]: this rank's two chunks of the sequence", call.op, name,
                                          ops::detail::shape_text(view->shape)));
    call.device = group.location().is_device();
    call.stream = options.gpu.stream;
    AttentionRunOptions plain = options;
    plain.return_lse = false, plain.backend = call.device ? Backend::gpu : Backend::cpu;
    const ops::AttentionArgs args = ops::bind_attention(call.op, variant, q, k, v, inputs, plain);
    if (args.Tq != args.Tk)
      throw InvalidArgument(fmt::format("{}: q holds {} tokens and k {}: each rank passes the same two chunks of q, k and v", call.op,
                                        args.Tq, args.Tk));
    if (args.Tq % 2 != 0)
      throw InvalidArgument(fmt::format("{}: q holds {} tokens, expected two chunks of equal length (context_parallel::attention_slice)",
                                        call.op, args.Tq));
    call.B = args.B, call.local = args.Tq, call.chunk = args.Tq / 2, call.H = args.H, call.H_kv = args.H_kv, call.D = args.D,
    call.Dv = args.Dv, call.type = args.type;
    if (more) more(call);
    d.values[Descriptor::variant_hash] = static_cast<std::int64_t>(ir::hash(variant));
    d.values[Descriptor::dtype] = static_cast<std::int64_t>(call.type);
    d.values[Descriptor::batch] = call.B, d.values[Descriptor::tokens] = call.local;
    d.values[Descriptor::heads] = call.H, d.values[Descriptor::kv_heads] = call.H_kv;
    d.values[Descriptor::key_dim] = call.D, d.values[Descriptor::value_dim] = call.Dv;
    d.values[Descriptor::return_state] = options.return_lse;
    d.values[Descriptor::location] = call.device ? 1 : 0;
    d.values[Descriptor::scalars_hash] = scalars_hash(inputs);
    d.values[Descriptor::window_left] = options.window_left, d.values[Descriptor::window_right] = options.window_right;
  } catch (const Error& e) {
    d.values[Descriptor::status] = 1;
    std::snprintf(d.message, sizeof d.message, "%s", e.what());
  }
  const std::vector<Descriptor> all = exchange(call.op, group, d, options.gpu.stream);
  for (int r = 1; r < call.P; ++r)
    if (all[r].values[Descriptor::tokens] != all[0].values[Descriptor::tokens])
      throw InvalidArgument(fmt::format("{}: rank 0 holds {} tokens, rank {} holds {}: the load-balanced split gives every rank two "
                                        "chunks of T / (2 ranks) (context_parallel::attention_slice)",
                                        call.op, all[0].values[Descriptor::tokens], r, all[r].values[Descriptor::tokens]));
  return call;
}

std::size_t bytes_of(DType t) { return dtype_size(t); }

// A view of rows [first, first + count) of axis 1 of a [B,T,X,Y] (or [B,X,T] for lse: axis 2) view.
TensorView rows(TensorView view, int axis, std::int64_t first, std::int64_t count) {
  view.data = static_cast<std::byte*>(view.data) + first * view.strides[static_cast<std::size_t>(axis)] * static_cast<std::int64_t>(bytes_of(view.type));
  view.shape[static_cast<std::size_t>(axis)] = count;
  return view;
}

void copy_bytes(const AttentionCall& call, void* to, const void* from, std::size_t bytes) {
  if (bytes == 0) return;
  if (call.device) copy_device_to_device(address(to), address(from), bytes, call.stream);
  else std::memcpy(to, from, bytes);
}

// dst = src for two views of one shape and dtype (where the call's tensors live): one copy per block
// of the trailing dims both hold densely.
void copy_view(const AttentionCall& call, const TensorView& dst, const TensorView& src) {
  const int rank = dst.rank();
  int dense = rank;  // dims [dense, rank) are dense in both
  std::int64_t block = 1;
  while (dense > 0) {
    const std::size_t d = static_cast<std::size_t>(dense - 1);
    if (dst.strides[d] != block || src.strides[d] != block) break;
    block *= dst.shape[d];
    --dense;
  }
  const std::size_t e = bytes_of(dst.type);
  std::vector<std::int64_t> index(static_cast<std::size_t>(dense), 0);
  std::int64_t count = 1;
  for (int d = 0; d < dense; ++d) count *= dst.shape[static_cast<std::size_t>(d)];
  for (std::int64_t n = 0; n < count; ++n) {
    std::int64_t to = 0, from = 0;
    for (int d = 0; d < dense; ++d) to += index[d] * dst.strides[d], from += index[d] * src.strides[d];
    copy_bytes(call, static_cast<std::byte*>(dst.data) + to * static_cast<std::int64_t>(e),
               static_cast<const std::byte*>(src.data) + from * static_cast<std::int64_t>(e), static_cast<std::size_t>(block) * e);
    for (int d = dense - 1; d >= 0; --d) {
      if (++index[d] < dst.shape[d]) break;
      index[d] = 0;
    }
  }
}

// A view as the GPU kernels take it: itself where dense, else a dense copy (`keep` holds it).
TensorView dense(const AttentionCall& call, const TensorView& view, Tensor& keep, bool copy_in) {
  if (view.is_contiguous()) return view;
  keep = Tensor(view.type, view.shape, call.device ? Location::device(0) : Location::host(), call.stream);
  if (copy_in) copy_view(call, keep.view(), view);
  return keep.view();
}

// The whole sequence's keys (or values) [B,T,H_kv,X] in order, from every rank's two chunks.
Tensor gather_sequence(Communicator& group, const AttentionCall& call, const TensorView& local, std::int64_t X) {
  const Location at = call.device ? Location::device(0) : Location::host();
  Tensor mine = local.is_contiguous() ? Tensor() : Tensor::copy_of(local, at, call.stream);
  const void* send = local.is_contiguous() ? local.data : mine.data();
  const std::size_t row = static_cast<std::size_t>(call.H_kv * X) * bytes_of(local.type);
  const std::size_t per_rank = static_cast<std::size_t>(call.B * call.local) * row;
  Tensor all(local.type, {static_cast<std::int64_t>(per_rank * call.P / bytes_of(local.type))}, at, call.stream);
  group.all_gather(send, all.data(), per_rank, call.stream);
  const std::int64_t T = call.local * call.P, c = call.chunk;
  Tensor whole(local.type, {call.B, T, call.H_kv, X}, at, call.stream);
  for (int j = 0; j < call.P; ++j) {
    const AttentionSlice slice = attention_slice(T, call.P, j);
    for (std::int64_t b = 0; b < call.B; ++b)
      for (int h = 0; h < 2; ++h) {
        const std::int64_t to_row = b * T + (h == 0 ? slice.first_begin : slice.second_begin);
        const std::int64_t from_row = (static_cast<std::int64_t>(j) * call.B + b) * call.local + h * c;
        copy_bytes(call, static_cast<std::byte*>(whole.data()) + to_row * row, static_cast<const std::byte*>(all.data()) + from_row * row,
                   static_cast<std::size_t>(c) * row);
      }
  }
  return whole;
}

}  // namespace

void run_attention_into(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                        const VariantInputs& inputs, const AttentionRunOptions& options, const AttentionOutputs& outputs,
                        Communicator& group) {
  const AttentionCall call = attention_begin("forward", variant, q, k, v, inputs, options, group, false, [&](const AttentionCall& c) {
    require_location(c.op, group, {{"o", &outputs.o}});
    if (outputs.lse) require_location(c.op, group, {{"lse", &*outputs.lse}});
    AttentionRunOptions checked = options;
    checked.backend = c.device ? Backend::gpu : Backend::cpu;
    ops::AttentionArgs args = ops::bind_attention(c.op, variant, q, k, v, inputs, checked);
    ops::bind_attention_outputs(c.op, checked, outputs, args);
  });
  const Tensor keys = gather_sequence(group, call, k, call.D), values = gather_sequence(group, call, v, call.Dv);
  const std::int64_t T = call.local * call.P;
  const AttentionSlice slice = attention_slice(T, call.P, call.rank);
  AttentionRunOptions local = options;
  local.backend = call.device ? Backend::gpu : Backend::cpu;
  for (int h = 0; h < 2; ++h) {
    // This chunk's queries against every key up to its end: causal and window masks are aligned at the
    // last query and the last key, so the chunk's rows see exactly what they see in the whole call.
    const std::int64_t end = h == 0 ? slice.first_end : slice.second_end;
    const TensorView o_part = rows(outputs.o, 1, h * call.chunk, call.chunk);
    std::optional<TensorView> lse_part;
    if (outputs.lse) lse_part = rows(*outputs.lse, 2, h * call.chunk, call.chunk);
    Tensor q_keep, o_keep, lse_keep;
    const AttentionOutputs part{dense(call, o_part, o_keep, false), lse_part ? std::optional<TensorView>(dense(call, *lse_part, lse_keep, false)) : std::nullopt};
    ladle::run_attention_into(variant, dense(call, rows(q, 1, h * call.chunk, call.chunk), q_keep, true), rows(keys.view(), 1, 0, end),
                              rows(values.view(), 1, 0, end), inputs, local, part);
    if (o_keep.numel() > 0) copy_view(call, o_part, o_keep.view());
    if (lse_keep.numel() > 0) copy_view(call, *lse_part, lse_keep.view());
    if (call.device) {  // the dense copies are freed at the end of this iteration
      if (call.stream) call.stream->synchronize();
      else Device::get().synchronize();
    }
  }
  if (call.device) {  // keys and values are freed on return
    if (call.stream) call.stream->synchronize();
    else Device::get().synchronize();
  }
}

AttentionResult run_attention(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                              const VariantInputs& inputs, const AttentionRunOptions& options, Communicator& group) {
  const Location at = q.location;
  std::vector<std::int64_t> shape = q.shape;
  if (shape.size() == 4 && v.shape.size() == 4) shape[3] = v.shape[3];
  AttentionResult result;
  result.o = at.is_device() ? Tensor(q.type, shape, at, options.gpu.stream) : Tensor(q.type, shape);
  std::optional<TensorView> lse;
  if (options.return_lse && q.shape.size() == 4) {
    const std::vector<std::int64_t> lse_shape{q.shape[0], q.shape[2], q.shape[1]};
    result.lse = at.is_device() ? Tensor(DType::f32, lse_shape, at, options.gpu.stream) : Tensor(DType::f32, lse_shape);
    lse = result.lse->view();
  }
  run_attention_into(variant, q, k, v, inputs, options, {result.o.view(), lse}, group);
  return result;
}

void run_attention_backward_into(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                 const VariantInputs& inputs, const AttentionRunOptions& options, const TensorView& o,
                                 const TensorView& lse, const TensorView& d_output, const AttentionGradientViews& gradients,
                                 Communicator& group) {
  const AttentionCall call = attention_begin("backward", variant, q, k, v, inputs, options, group, true, [&](const AttentionCall& c) {
    require_location(c.op, group, {{"o", &o}, {"lse", &lse}, {"d_output", &d_output}, {"dq", &gradients.dq}, {"dk", &gradients.dk},
                                   {"dv", &gradients.dv}});
    const auto f32 = [&](const char* name, const TensorView& g, const TensorView& of) {
      if (g.shape != of.shape || g.type != DType::f32 || !g.is_contiguous())
        throw InvalidArgument(fmt::format("{}: {} is {}, expected contiguous f32 {}", c.op, name, describe(g), ops::detail::shape_text(of.shape)));
    };
    f32("dq", gradients.dq, q), f32("dk", gradients.dk, k), f32("dv", gradients.dv, v);
    const std::vector<std::int64_t> want_lse{c.B, c.H, c.local};
    if (lse.shape != want_lse || lse.type != DType::f32)
      throw InvalidArgument(fmt::format("{}: lse is {}, expected the forward's f32 {}", c.op, describe(lse), ops::detail::shape_text(want_lse)));
    AttentionRunOptions checked = options;
    checked.return_lse = true, checked.backend = c.device ? Backend::gpu : Backend::cpu;
    ops::AttentionArgs args = ops::bind_attention(c.op, variant, q, k, v, inputs, checked);
    ops::bind_attention_outputs(c.op, checked, {o, lse}, args);
    if (d_output.shape != o.shape) throw InvalidArgument(fmt::format("{}: d_output has shape {}, expected o's {}", c.op,
                                                                     ops::detail::shape_text(d_output.shape), ops::detail::shape_text(o.shape)));
    if (c.device)
      if (const auto why = gpu::gpu_attention_backward_unsupported(variant, args); !why.empty())
        throw InvalidArgument(c.op + ": the GPU backward does not run this call: " + why.front());
  });
  const Location at = call.device ? Location::device(0) : Location::host();
  const Tensor keys = gather_sequence(group, call, k, call.D), values = gather_sequence(group, call, v, call.Dv);
  const std::int64_t T = call.local * call.P, c = call.chunk;
  const AttentionSlice slice = attention_slice(T, call.P, call.rank);
  // Every rank's share of every key's gradient, summed over the ranks below.
  Tensor dk_all(DType::f32, {call.B, T, call.H_kv, call.D}, at, call.stream), dv_all(DType::f32, {call.B, T, call.H_kv, call.Dv}, at, call.stream);
  const auto zero_tensor = [&](Tensor& t) {
    if (call.device) fill_device_bytes(address(t.data()), t.bytes(), 0, call.stream);
    else std::memset(t.data(), 0, t.bytes());
  };
  zero_tensor(dk_all), zero_tensor(dv_all);
  AttentionRunOptions local = options;
  local.return_lse = true, local.backend = call.device ? Backend::gpu : Backend::cpu;
  for (int h = 0; h < 2; ++h) {
    const std::int64_t end = h == 0 ? slice.first_end : slice.second_end;
    Tensor q_keep, o_keep, lse_keep, do_keep, dq_keep;
    const TensorView qc = dense(call, rows(q, 1, h * c, c), q_keep, true), kc = rows(keys.view(), 1, 0, end), vc = rows(values.view(), 1, 0, end);
    ops::AttentionArgs args = ops::bind_attention(call.op, variant, qc, kc, vc, inputs, local);
    ops::bind_attention_outputs(call.op, local, {dense(call, rows(o, 1, h * c, c), o_keep, true), dense(call, rows(lse, 2, h * c, c), lse_keep, true)},
                                args);
    const TensorView dq_part = rows(gradients.dq, 1, h * c, c);
    Tensor dk_part(DType::f32, {call.B, end, call.H_kv, call.D}, at, call.stream), dv_part(DType::f32, {call.B, end, call.H_kv, call.Dv}, at, call.stream);
    cpu::AttentionGrads grads;
    grads.d_output = dense(call, rows(d_output, 1, h * c, c), do_keep, true);
    grads.dq = dense(call, dq_part, dq_keep, false);
    grads.dk = dk_part.view(), grads.dv = dv_part.view();
    grads.d_tensors.assign(variant.inputs.size(), std::nullopt);
    if (call.device) {
      gpu::run_attention_backward_into(variant, args, grads, {call.stream});
    } else {
      zero_tensor(dk_part), zero_tensor(dv_part);
      for (std::int64_t b = 0; b < call.B; ++b)  // the chunk's dq rows start at zero
        std::memset(static_cast<std::byte*>(grads.dq.data) + b * grads.dq.strides[0] * 4, 0, static_cast<std::size_t>(c * call.H * call.D) * 4);
      cpu::run_attention_backward(variant, args, grads);
    }
    if (dq_keep.numel() > 0) copy_view(call, dq_part, dq_keep.view());
    // dk_all[:, :end] += dk_part (and dv).
    const auto add = [&](Tensor& to, const Tensor& from, std::int64_t X) {
      const std::int64_t n = end * call.H_kv * X;
      if (call.device) {
        KernelArgs packed;
        packed.add(address(to.data())).add(static_cast<long long>(T * call.H_kv * X)).add(address(from.data())).add(static_cast<long long>(n));
        packed.add(static_cast<long long>(n));
        cp_kernel(cuda::context_parallel_add_kernel)
            .function->launch({static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(call.B), 1}, {256, 1, 1}, packed, 0, call.stream);
      } else {
        for (std::int64_t b = 0; b < call.B; ++b) {
          float* t = static_cast<float*>(to.data()) + b * T * call.H_kv * X;
          const float* f = static_cast<const float*>(from.data()) + b * n;
          for (std::int64_t i = 0; i < n; ++i) t[i] += f[i];
        }
      }
    };
    add(dk_all, dk_part, call.D), add(dv_all, dv_part, call.Dv);
    if (call.device) {  // the parts are freed at the end of this iteration
      if (call.stream) call.stream->synchronize();
      else Device::get().synchronize();
    }
  }
  group.all_sum(static_cast<float*>(dk_all.data()), static_cast<std::size_t>(dk_all.numel()), call.stream);
  group.all_sum(static_cast<float*>(dv_all.data()), static_cast<std::size_t>(dv_all.numel()), call.stream);
  // This rank's two chunks of them.
  for (int h = 0; h < 2; ++h) {
    const std::int64_t first = h == 0 ? slice.first_begin : slice.second_begin;
    for (std::int64_t b = 0; b < call.B; ++b) {
      const std::size_t krow = static_cast<std::size_t>(call.H_kv * call.D) * 4, vrow = static_cast<std::size_t>(call.H_kv * call.Dv) * 4;
      copy_bytes(call, static_cast<std::byte*>(gradients.dk.data) + (b * call.local + h * c) * krow,
                 static_cast<const std::byte*>(dk_all.data()) + (b * T + first) * krow, static_cast<std::size_t>(c) * krow);
      copy_bytes(call, static_cast<std::byte*>(gradients.dv.data) + (b * call.local + h * c) * vrow,
                 static_cast<const std::byte*>(dv_all.data()) + (b * T + first) * vrow, static_cast<std::size_t>(c) * vrow);
    }
  }
  if (call.device) {
    if (call.stream) call.stream->synchronize();
    else Device::get().synchronize();
  }
}

}  // namespace ladle::context_parallel
