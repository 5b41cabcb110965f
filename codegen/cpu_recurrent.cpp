#include "cpu_recurrent.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "cpu_expr.h"
#include "detail/parallel.h"
#include "float16.h"

namespace ladle::cpu {

namespace {

constexpr std::size_t slot_index(ir::Slot s) { return static_cast<std::size_t>(s); }

std::byte* element(const TensorView& view, std::initializer_list<std::int64_t> index) {
  std::int64_t offset = 0;
  auto stride = view.strides.begin();
  for (std::int64_t i : index) offset += i * *stride++;
  return static_cast<std::byte*>(view.data) + offset * static_cast<std::int64_t>(element_size(view.type));
}

// Loads the inputs of one (batch row, token, query head) for the row programs.
class TokenLoader final : public InputLoader {
 public:
  TokenLoader(const ir::Variant& variant, const RecurrentArgs& args) : variant_(variant), args_(args) {}
  void at(std::int64_t b, std::int64_t t, std::int64_t h) {
    b_ = b;
    t_ = t;
    h_ = h;
  }
  void load(std::int32_t index, float* out, std::int64_t n) const override {
    const ir::InputKind kind = variant_.inputs[index].kind;
    if (kind == ir::InputKind::scalar) {
      out[0] = args_.scalars[index];
      return;
    }
    const TensorView& view = args_.tensors[index];
    const int head_dim = kind == ir::InputKind::head ? 1 : 2;
    const std::int64_t hx = h_ * view.shape[head_dim] / args_.heads;
    if (kind == ir::InputKind::head) {
      out[0] = narrow_float::load(element(view, {b_, hx}), view.type);
    } else if (kind == ir::InputKind::token_head) {
      out[0] = narrow_float::load(element(view, {b_, t_, hx}), view.type);
    } else {
      const std::byte* p = element(view, {b_, t_, hx, 0});
      const std::int64_t step = view.strides[3] * static_cast<std::int64_t>(element_size(view.type));
      if (view.type == ElementType::f32 && view.strides[3] == 1) {
        std::copy_n(reinterpret_cast<const float*>(p), n, out);
      } else {
        for (std::int64_t j = 0; j < n; ++j) out[j] = narrow_float::load(p + j * step, view.type);
      }
    }
  }

 private:
  const ir::Variant& variant_;
  const RecurrentArgs& args_;
  std::int64_t b_ = 0, t_ = 0, h_ = 0;
};

// One row program per slot, with the width it is evaluated at.
struct Programs {
  std::array<RowProgram, ir::slot_count> slot;
  std::size_t scratch = 0;
};

// Runs one (sequence, head) pair. Scratch buffers belong to the calling thread.
class Worker {
 public:
  Worker(const ir::Variant& variant, const RecurrentArgs& args, const Programs& programs)
      : variant_(variant), args_(args), programs_(programs), loader_(variant, args) {
    const std::int64_t K = args.key_dim, V = args.value_dim;
    state_.resize(static_cast<std::size_t>(K * V));
    normaliser_.resize(static_cast<std::size_t>(K));
    scratch_.resize(programs.scratch);
    decay_k_.resize(static_cast<std::size_t>(K));
    decay_v_.resize(static_cast<std::size_t>(V));
    query_.resize(static_cast<std::size_t>(K));
    out_.resize(static_cast<std::size_t>(V));
    for (std::size_t s = 0; s < ir::slot_count; ++s) {
      cached_[s].resize(static_cast<std::size_t>(s == slot_index(ir::Slot::v) || s == slot_index(ir::Slot::log_decay_v) ? V : K));
    }
  }

  void run(std::int64_t n, std::int64_t h) {
    const std::int64_t K = args_.key_dim, V = args_.value_dim;
    std::int64_t b = n, begin = 0, end = args_.tokens;
    if (!args_.cu_seqlens.empty()) {
      b = 0;
      begin = args_.cu_seqlens[n];
      end = args_.cu_seqlens[n + 1];
    }
    float* S = state_.data();
    if (args_.initial_state) {
      const TensorView& h0 = *args_.initial_state;
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) S[i * V + j] = narrow_float::load(element(h0, {n, h, i, j}), h0.type);
    } else {
      std::fill(state_.begin(), state_.end(), 0.0f);
    }
    std::fill(normaliser_.begin(), normaliser_.end(), 0.0f);

    // Slots that do not vary over tokens are evaluated once for the pair.
    loader_.at(b, begin, h);
    for (std::size_t s = 0; s < ir::slot_count; ++s)
      if (!programs_.slot[s].empty() && !programs_.slot[s].varies_over_tokens()) evaluate(s);

    const std::int64_t count = end - begin;
    for (std::int64_t step = 0; step < count; ++step) {
      const std::int64_t t = args_.reverse ? end - 1 - step : begin + step;
      loader_.at(b, t, h);
      for (std::size_t s = 0; s < ir::slot_count; ++s)
        if (!programs_.slot[s].empty() && programs_.slot[s].varies_over_tokens()) evaluate(s);
      token(b, t, h);
    }

    if (args_.final_state) {
      const TensorView& ht = *args_.final_state;
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) narrow_float::store(element(ht, {n, h, i, j}), ht.type, S[i * V + j]);
    }
  }

 private:
  // Evaluates slot s into cached_[s], broadcasting a one-value result over its row.
  void evaluate(std::size_t s) {
    const RowProgram& program = programs_.slot[s];
    const float* result = program.evaluate(loader_, scratch_.data());
    std::vector<float>& row = cached_[s];
    if (program.varies_over_features())
      std::copy_n(result, row.size(), row.begin());
    else
      std::fill(row.begin(), row.end(), result[0]);
  }

  const std::vector<float>& slot(ir::Slot s) const { return cached_[slot_index(s)]; }
  bool has(ir::Slot s) const { return !programs_.slot[slot_index(s)].empty(); }

  // S_t = diag(a) S_{t-1} diag(b) + k v^T, a = exp(log_decay_k + log_decay_head),
  // b = exp(log_decay_v); o_t = (scale q)^T S_t, optionally normalised.
  void token(std::int64_t b, std::int64_t t, std::int64_t h) {
    const std::int64_t K = args_.key_dim, V = args_.value_dim;
    const bool decays_k = has(ir::Slot::log_decay_k) || has(ir::Slot::log_decay_head);
    const bool decays_v = has(ir::Slot::log_decay_v);
    if (decays_k) {
      for (std::int64_t i = 0; i < K; ++i) {
        float log_a = has(ir::Slot::log_decay_k) ? slot(ir::Slot::log_decay_k)[i] : 0.0f;
        if (has(ir::Slot::log_decay_head)) log_a += slot(ir::Slot::log_decay_head)[0];
        decay_k_[i] = std::exp(log_a);
      }
    }
    if (decays_v)
      for (std::int64_t j = 0; j < V; ++j) decay_v_[j] = std::exp(slot(ir::Slot::log_decay_v)[j]);

    const float scale = has(ir::Slot::scale) ? slot(ir::Slot::scale)[0] : 1.0f;
    const std::vector<float>& q = slot(ir::Slot::q_feature);
    const std::vector<float>& k = slot(ir::Slot::k_feature);
    const std::vector<float>& v = slot(ir::Slot::v);
    for (std::int64_t i = 0; i < K; ++i) query_[i] = scale * q[i];

    std::fill(out_.begin(), out_.end(), 0.0f);
    float* S = state_.data();
    for (std::int64_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float a = decays_k ? decay_k_[i] : 1.0f, ki = k[i], qi = query_[i];
      if (decays_v) {
        for (std::int64_t j = 0; j < V; ++j) row[j] = row[j] * a * decay_v_[j] + ki * v[j];
      } else {
        for (std::int64_t j = 0; j < V; ++j) row[j] = row[j] * a + ki * v[j];
      }
      for (std::int64_t j = 0; j < V; ++j) out_[j] += qi * row[j];
    }
    if (variant_.normalize) {
      float z = 0.0f;
      for (std::int64_t i = 0; i < K; ++i) {
        normaliser_[i] = normaliser_[i] * (decays_k ? decay_k_[i] : 1.0f) + k[i];
        z += query_[i] * normaliser_[i];
      }
      const float denominator = z + variant_.normalize_eps;
      for (std::int64_t j = 0; j < V; ++j) out_[j] /= denominator;
    }
    const TensorView& o = args_.output;
    for (std::int64_t j = 0; j < V; ++j) narrow_float::store(element(o, {b, t, h, j}), o.type, out_[j]);
  }

  const ir::Variant& variant_;
  const RecurrentArgs& args_;
  const Programs& programs_;
  TokenLoader loader_;
  std::vector<float> state_, normaliser_, scratch_, decay_k_, decay_v_, query_, out_;
  std::array<std::vector<float>, ir::slot_count> cached_;
};

}  // namespace

void run_recurrent(const ir::Variant& variant, const RecurrentArgs& args) {
  Programs programs;
  for (std::size_t s = 0; s < ir::slot_count; ++s) {
    const ir::Slot slot = static_cast<ir::Slot>(s);
    const bool value_side = slot == ir::Slot::v || slot == ir::Slot::log_decay_v;
    if (variant.slots[s].empty()) continue;
    programs.slot[s] = RowProgram(variant, variant.slots[s], value_side ? args.value_dim : args.key_dim);
    programs.scratch = std::max(programs.scratch, programs.slot[s].scratch_size());
  }

  const std::int64_t sequences =
      args.cu_seqlens.empty() ? args.batch : static_cast<std::int64_t>(args.cu_seqlens.size()) - 1;
  const std::int64_t pairs = sequences * args.heads;
  if (pairs <= 0) return;
  detail::parallel_items(pairs, args.threads, [&] {
    return [worker = std::make_shared<Worker>(variant, args, programs), &args](std::int64_t p) {
      worker->run(p / args.heads, p % args.heads);
    };
  });
}

}  // namespace ladle::cpu
