#include "recurrent.h"
#include "update_form_steps.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "expr.h"
#include "parallel.h"
#include <ladle/tensor/dtype.h>

namespace ladle::cpu {

namespace {

constexpr std::size_t slot_index(ir::Slot s) { return static_cast<std::size_t>(s); }

std::byte* element(const TensorView& view, std::initializer_list<std::int64_t> index) {
  std::int64_t offset = 0;
  auto stride = view.strides.begin();
  for (std::int64_t i : index) offset += i * *stride++;
  return static_cast<std::byte*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.type));
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
      out[0] = load_float(element(view, {b_, hx}), view.type);
    } else if (kind == ir::InputKind::token_head) {
      out[0] = load_float(element(view, {b_, t_, hx}), view.type);
    } else {
      const std::byte* p = element(view, {b_, t_, hx, 0});
      const std::int64_t step = view.strides[3] * static_cast<std::int64_t>(dtype_size(view.type));
      if (view.type == DType::f32 && view.strides[3] == 1) {
        std::copy_n(reinterpret_cast<const float*>(p), n, out);
      } else {
        for (std::int64_t j = 0; j < n; ++j) out[j] = load_float(p + j * step, view.type);
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
    key_.resize(static_cast<std::size_t>(K));
    correction_.resize(static_cast<std::size_t>(V));
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
        for (std::int64_t j = 0; j < V; ++j) S[i * V + j] = load_float(element(h0, {n, h, i, j}), h0.type);
    } else {
      std::fill(state_.begin(), state_.end(), 0.0f);
    }
    std::fill(normaliser_.begin(), normaliser_.end(), 0.0f);

    // Slots that do not vary over tokens are evaluated once for the pair.
    loader_.at(b, begin, h);
    for (std::size_t s = 0; s < ir::slot_count; ++s)
      if (!programs_.slot[s].empty() && !programs_.slot[s].varies_over_tokens()) evaluate(s);

    const std::int64_t count = end - begin;
    RecurrentCheckpoints* const saved = args_.checkpoints;
    for (std::int64_t step = 0; step < count; ++step) {
      if (saved && step % saved->interval == 0) {
        float* at = saved->values.data() + ((saved->first_chunk[static_cast<std::size_t>(n)] + step / saved->interval) * args_.heads + h) * (K * V + K);
        std::copy_n(S, K * V, at);
        std::copy_n(normaliser_.data(), K, at + K * V);
      }
      const std::int64_t t = args_.reverse ? end - 1 - step : begin + step;
      loader_.at(b, t, h);
      for (std::size_t s = 0; s < ir::slot_count; ++s)
        if (!programs_.slot[s].empty() && programs_.slot[s].varies_over_tokens()) evaluate(s);
      token(b, t, h);
    }

    if (args_.final_state) {
      const TensorView& ht = *args_.final_state;
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) store_float(element(ht, {n, h, i, j}), ht.type, S[i * V + j]);
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
    if (!variant_.plain_form()) {
      token_update_form(b, t, h);
      return;
    }
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
    for (std::int64_t j = 0; j < V; ++j) store_float(element(o, {b, t, h, j}), o.type, out_[j]);
  }

  // The other update forms (ir.h): the delta rule, read after its update, and a read before a
  // diagonal update with a bonus on the current token; q and k optionally L2-normalised.
  void token_update_form(std::int64_t b, std::int64_t t, std::int64_t h) {
    const std::int64_t K = args_.key_dim, V = args_.value_dim;
    const float scale = has(ir::Slot::scale) ? slot(ir::Slot::scale)[0] : 1.0f;
    const std::vector<float>& q = slot(ir::Slot::q_feature);
    const std::vector<float>& v = slot(ir::Slot::v);
    key_ = slot(ir::Slot::k_feature);
    float q_norm = 1.0f;
    if (variant_.l2_normalize_qk) {
      double qq = 0, kk = 0;
      for (std::int64_t i = 0; i < K; ++i) qq += double(q[i]) * q[i], kk += double(key_[i]) * key_[i];
      q_norm = static_cast<float>(1.0 / std::sqrt(qq + ir::l2_normalize_eps));
      const float k_norm = static_cast<float>(1.0 / std::sqrt(kk + ir::l2_normalize_eps));
      for (std::int64_t i = 0; i < K; ++i) key_[i] *= k_norm;
    }
    for (std::int64_t i = 0; i < K; ++i) query_[i] = scale * q_norm * q[i];
    const float head_decay = has(ir::Slot::log_decay_head) ? std::exp(slot(ir::Slot::log_decay_head)[0]) : 1.0f;
    float* S = state_.data();
    std::fill(out_.begin(), out_.end(), 0.0f);
    if (variant_.update == ir::Update::delta) {
      // S <- diag(a) S (a per head, or per key feature: KDA); S <- S + beta k (v - S^T k)^T; o = q^T S.
      const float beta = has(ir::Slot::write_strength) ? slot(ir::Slot::write_strength)[0] : 1.0f;
      std::vector<float>& correction = correction_;  // S^T k, then beta (v - S^T k)
      std::fill(correction.begin(), correction.end(), 0.0f);
      for (std::int64_t i = 0; i < K; ++i) {
        float* row = S + i * V;
        const float a = has(ir::Slot::log_decay_k) ? std::exp(slot(ir::Slot::log_decay_k)[i]) * head_decay : head_decay;
        for (std::int64_t j = 0; j < V; ++j) {
          row[j] *= a;
          correction[j] += key_[i] * row[j];
        }
      }
      for (std::int64_t j = 0; j < V; ++j) correction[j] = beta * (v[j] - correction[j]);
      for (std::int64_t i = 0; i < K; ++i) {
        float* row = S + i * V;
        const float ki = key_[i], qi = query_[i];
        for (std::int64_t j = 0; j < V; ++j) {
          row[j] += ki * correction[j];
          out_[j] += qi * row[j];
        }
      }
    } else {
      // o = q^T S_{t-1} + (q . diag(u) k) v, then S <- diag(a) S + k v^T.
      float bonus = 0.0f;
      if (has(ir::Slot::bonus))
        for (std::int64_t i = 0; i < K; ++i) bonus += query_[i] * slot(ir::Slot::bonus)[i] * key_[i];
      for (std::int64_t i = 0; i < K; ++i) {
        float* row = S + i * V;
        const float a = (has(ir::Slot::log_decay_k) ? std::exp(slot(ir::Slot::log_decay_k)[i]) : 1.0f) * head_decay;
        const float ki = key_[i], qi = query_[i];
        for (std::int64_t j = 0; j < V; ++j) {
          out_[j] += qi * row[j];
          row[j] = row[j] * a + ki * v[j];
        }
      }
      for (std::int64_t j = 0; j < V; ++j) out_[j] += bonus * v[j];
    }
    const TensorView& o = args_.output;
    for (std::int64_t j = 0; j < V; ++j) store_float(element(o, {b, t, h, j}), o.type, out_[j]);
  }

  const ir::Variant& variant_;
  const RecurrentArgs& args_;
  const Programs& programs_;
  TokenLoader loader_;
  std::vector<float> state_, normaliser_, scratch_, decay_k_, decay_v_, query_, out_, key_, correction_;
  std::array<std::vector<float>, ir::slot_count> cached_;
};

// d slot / d input for one (slot, input) pair the slot reads, and whether the input varies over
// features (its gradient is added per feature, else summed over the row).
struct GradProgram {
  ir::Slot slot;
  std::int32_t input;
  RowProgram program;
  bool input_over_features;
};

using SlotRows = std::array<std::vector<float>, ir::slot_count>;

// The chain rule from the slots' gradients at one token to the inputs': d input += d slot times
// d slot / d input (evaluated at the token), per feature or summed over the row. Gradients of
// per-head inputs (shared by every sequence, broadcast over B) go into this object's own sums.
class Chain {
 public:
  Chain(const ir::Variant& variant, const RecurrentArgs& args, const std::vector<std::optional<TensorView>>& d_tensors,
        const std::vector<GradProgram>& grad_programs)
      : variant_(variant), args_(args), d_tensors_(d_tensors), grad_programs_(grad_programs), loader_(variant, args) {
    std::size_t scratch = 0;
    for (const GradProgram& g : grad_programs) scratch = std::max(scratch, g.program.scratch_size());
    scratch_.resize(scratch);
    head_grads_.resize(variant.inputs.size());
    for (const GradProgram& g : grad_programs)
      if (shared(variant.inputs[static_cast<std::size_t>(g.input)].kind)) {
        const TensorView& d = *d_tensors[static_cast<std::size_t>(g.input)];
        // head [B,H]; head_key [B,T,H,K] over memory of [H,K] or [B,H,K] (no token stride).
        const std::int64_t n = d.rank() == 2 ? d.shape[0] * d.shape[1] : d.shape[0] * d.shape[2] * d.shape[3];
        head_grads_[static_cast<std::size_t>(g.input)].assign(static_cast<std::size_t>(n), 0.0f);
      }
  }

  // g: each slot's gradient at token (b, t, h), K or V values (one for the head decay and the scale).
  void token(std::int64_t b, std::int64_t t, std::int64_t h, const SlotRows& g) {
    loader_.at(b, t, h);
    for (const GradProgram& gp : grad_programs_) {
      const std::vector<float>& gs = g[slot_index(gp.slot)];
      const float* p = gp.program.evaluate(loader_, scratch_.data());
      const bool p_row = gp.program.varies_over_features();
      const TensorView& d = *d_tensors_[static_cast<std::size_t>(gp.input)];
      const ir::InputKind kind = variant_.inputs[static_cast<std::size_t>(gp.input)].kind;
      const int head_dim = kind == ir::InputKind::head ? 1 : 2;
      const std::int64_t hx = h * d.shape[head_dim] / args_.heads;
      if (kind == ir::InputKind::head_key) {  // shared by every token (and sequence): this worker's sums
        float* const sums = head_grads_[static_cast<std::size_t>(gp.input)].data() + (b * d.shape[2] + hx) * d.shape[3];
        for (std::size_t f = 0; f < gs.size(); ++f) sums[f] += gs[f] * p[p_row ? f : 0];
      } else if (gp.input_over_features) {
        for (std::size_t f = 0; f < gs.size(); ++f)
          *reinterpret_cast<float*>(element(d, {b, t, hx, static_cast<std::int64_t>(f)})) += gs[f] * p[p_row ? f : 0];
      } else {
        float total = 0.0f;
        for (std::size_t f = 0; f < gs.size(); ++f) total += gs[f] * p[p_row ? f : 0];
        if (kind == ir::InputKind::head)
          head_grads_[static_cast<std::size_t>(gp.input)][static_cast<std::size_t>(b * d.shape[1] + hx)] += total;
        else
          *reinterpret_cast<float*>(element(d, {b, t, hx})) += total;
      }
    }
  }

  // Inputs every token (and sequence) of a head shares: their gradients are summed per worker, then flushed.
  static bool shared(ir::InputKind kind) { return kind == ir::InputKind::head || kind == ir::InputKind::head_key; }

  // Adds this object's sums of per-head inputs' gradients into their views (one at a time).
  void flush_head_grads() const {
    for (std::size_t x = 0; x < head_grads_.size(); ++x) {
      if (head_grads_[x].empty()) continue;
      const TensorView& d = *d_tensors_[x];
      if (d.rank() == 4) {  // head_key
        for (std::int64_t b = 0; b < d.shape[0]; ++b)
          for (std::int64_t hx = 0; hx < d.shape[2]; ++hx)
            for (std::int64_t f = 0; f < d.shape[3]; ++f)
              *reinterpret_cast<float*>(element(d, {b, 0, hx, f})) += head_grads_[x][static_cast<std::size_t>((b * d.shape[2] + hx) * d.shape[3] + f)];
        continue;
      }
      for (std::int64_t b = 0; b < d.shape[0]; ++b)
        for (std::int64_t hx = 0; hx < d.shape[1]; ++hx)
          *reinterpret_cast<float*>(element(d, {b, hx})) += head_grads_[x][static_cast<std::size_t>(b * d.shape[1] + hx)];
    }
  }

 private:
  const ir::Variant& variant_;
  const RecurrentArgs& args_;
  const std::vector<std::optional<TensorView>>& d_tensors_;
  const std::vector<GradProgram>& grad_programs_;
  TokenLoader loader_;
  std::vector<float> scratch_;
  std::vector<std::vector<float>> head_grads_;
};

// Sizes each slot's gradient row: K or V values, one for the head decay and the scale.
void size_slot_rows(SlotRows& g, std::int64_t K, std::int64_t V) {
  for (std::size_t s = 0; s < ir::slot_count; ++s)
    g[s].resize(static_cast<std::size_t>(s == slot_index(ir::Slot::v) || s == slot_index(ir::Slot::log_decay_v) ? V
                                         : s == slot_index(ir::Slot::log_decay_head) || s == slot_index(ir::Slot::scale) ||
                                                   s == slot_index(ir::Slot::write_strength)
                                             ? 1
                                             : K));
}

// The backward of one (sequence, head) pair at a time (see run_recurrent_backward).
class Backward {
 public:
  static constexpr std::int64_t C = 64;  // tokens between checkpoints

  Backward(const ir::Variant& variant, const RecurrentArgs& args, const RecurrentGrads& grads, const Programs& programs,
           const std::vector<GradProgram>& grad_programs)
      : variant_(variant), args_(args), grads_(grads), programs_(programs), loader_(variant, args),
        chain_(variant, args, grads.d_tensors, grad_programs) {
    const std::size_t K = static_cast<std::size_t>(args.key_dim), V = static_cast<std::size_t>(args.value_dim);
    scratch_.resize(programs.scratch);
    for (std::size_t s = 0; s < ir::slot_count; ++s)
      rows_[s].resize(s == slot_index(ir::Slot::v) || s == slot_index(ir::Slot::log_decay_v) ? V : K);
    a_.resize(K), bv_.resize(V);
    chunk_states_.resize(static_cast<std::size_t>(C + 1) * K * V);
    chunk_z_.resize(static_cast<std::size_t>(C + 1) * K);
    dS_.resize(K * V), dz_.resize(K), do_.resize(V), num_.resize(V);
    qhat_.resize(K), khat_.resize(K), dqhat_.resize(K), dkhat_.resize(K), work_.resize(3 * V + K * V);
    size_slot_rows(g_, args.key_dim, args.value_dim);
  }

  void flush_head_grads() const { chain_.flush_head_grads(); }

  void run(std::int64_t n, std::int64_t h) {
    const std::int64_t K = args_.key_dim, V = args_.value_dim, KV = K * V;
    std::int64_t b = n, begin = 0, end = args_.tokens;
    if (!args_.cu_seqlens.empty()) b = 0, begin = args_.cu_seqlens[n], end = args_.cu_seqlens[n + 1];
    const std::int64_t count = end - begin, chunks = (count + C - 1) / C;
    const auto token_at = [&](std::int64_t step) { return args_.reverse ? end - 1 - step : begin + step; };

    // 1. The state (and normaliser) entering every chunk, as the forward saved them.
    const RecurrentCheckpoints& saved = *grads_.checkpoints;
    checkpoints_.resize(static_cast<std::size_t>(std::max<std::int64_t>(chunks, 1) * KV));
    z_checkpoints_.resize(static_cast<std::size_t>(std::max<std::int64_t>(chunks, 1) * K));
    for (std::int64_t c = 0; c < chunks; ++c) {
      const float* at = saved.values.data() + ((saved.first_chunk[static_cast<std::size_t>(n)] + c) * args_.heads + h) * (KV + K);
      std::copy_n(at, KV, checkpoints_.data() + c * KV);
      std::copy_n(at + KV, K, z_checkpoints_.data() + c * K);
    }

    // 2. Back from the last token: dS = dL/dS_t (from d_final_state), chunk by chunk from its checkpoint.
    std::fill(dS_.begin(), dS_.end(), 0.0f);
    std::fill(dz_.begin(), dz_.end(), 0.0f);
    if (grads_.d_final_state) {
      const TensorView& d = *grads_.d_final_state;
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) dS_[static_cast<std::size_t>(i * V + j)] = load_float(element(d, {n, h, i, j}), d.type);
    }
    for (std::int64_t c = chunks - 1; c >= 0; --c) {
      const std::int64_t s0 = c * C, s1 = std::min(count, s0 + C);
      std::copy_n(checkpoints_.data() + c * KV, KV, chunk_states_.data());
      std::copy_n(z_checkpoints_.data() + c * K, K, chunk_z_.data());
      for (std::int64_t step = s0; step < s1; ++step) {
        const std::int64_t i = step - s0;
        slots(b, token_at(step), h);
        advance(chunk_states_.data() + i * KV, chunk_states_.data() + (i + 1) * KV, chunk_z_.data() + i * K, chunk_z_.data() + (i + 1) * K);
      }
      for (std::int64_t step = s1 - 1; step >= s0; --step) {
        const std::int64_t i = step - s0, t = token_at(step);
        slots(b, t, h);
        back_step(b, t, h, chunk_states_.data() + i * KV, chunk_states_.data() + (i + 1) * KV, chunk_z_.data() + i * K,
                  chunk_z_.data() + (i + 1) * K);
      }
    }
    if (grads_.d_initial_state) {
      const TensorView& d = *grads_.d_initial_state;
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) *reinterpret_cast<float*>(element(d, {n, h, i, j})) = dS_[static_cast<std::size_t>(i * V + j)];
    }
  }

 private:
  const std::vector<float>& row(ir::Slot s) const { return rows_[slot_index(s)]; }
  bool has(ir::Slot s) const { return !programs_.slot[slot_index(s)].empty(); }

  // Every slot of token t (a row of K or V values; a broadcast value fills its row), and the decays.
  void slots(std::int64_t b, std::int64_t t, std::int64_t h) {
    loader_.at(b, t, h);
    for (std::size_t s = 0; s < ir::slot_count; ++s) {
      const RowProgram& program = programs_.slot[s];
      if (program.empty()) continue;
      const float* result = program.evaluate(loader_, scratch_.data());
      if (program.varies_over_features()) std::copy_n(result, rows_[s].size(), rows_[s].begin());
      else std::fill(rows_[s].begin(), rows_[s].end(), result[0]);
    }
    for (std::size_t i = 0; i < a_.size(); ++i) {
      float log_a = has(ir::Slot::log_decay_k) ? row(ir::Slot::log_decay_k)[i] : 0.0f;
      if (has(ir::Slot::log_decay_head)) log_a += row(ir::Slot::log_decay_head)[0];
      a_[i] = std::exp(log_a);
    }
    for (std::size_t j = 0; j < bv_.size(); ++j) bv_[j] = has(ir::Slot::log_decay_v) ? std::exp(row(ir::Slot::log_decay_v)[j]) : 1.0f;
    scale_ = has(ir::Slot::scale) ? row(ir::Slot::scale)[0] : 1.0f;
    if (variant_.plain_form()) return;
    // The update forms: q and k as the recurrence reads them (L2-normalised where asked, q times the
    // scale), the head decay, beta.
    const std::vector<float>& q = row(ir::Slot::q_feature);
    const std::vector<float>& k = row(ir::Slot::k_feature);
    q_rn_ = k_rn_ = 1.0f;
    if (variant_.l2_normalize_qk) {
      double qq = 0, kk = 0;
      for (std::size_t i = 0; i < q.size(); ++i) qq += double(q[i]) * q[i], kk += double(k[i]) * k[i];
      q_rn_ = static_cast<float>(1.0 / std::sqrt(qq + ir::l2_normalize_eps));
      k_rn_ = static_cast<float>(1.0 / std::sqrt(kk + ir::l2_normalize_eps));
    }
    for (std::size_t i = 0; i < q.size(); ++i) qhat_[i] = scale_ * q_rn_ * q[i], khat_[i] = k_rn_ * k[i];
    beta_ = has(ir::Slot::write_strength) ? row(ir::Slot::write_strength)[0] : 1.0f;
  }

  // S_t = diag(a) S_{t-1} diag(b) + k v^T and z_t = a z_{t-1} + k (in place when next == prev).
  void advance(const float* prev, float* next, const float* zprev, float* znext) {
    const std::int64_t K = args_.key_dim, V = args_.value_dim;
    if (!variant_.plain_form()) return advance_update_form(prev, next);
    const std::vector<float>& k = row(ir::Slot::k_feature);
    const std::vector<float>& v = row(ir::Slot::v);
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t j = 0; j < V; ++j) next[i * V + j] = prev[i * V + j] * a_[i] * bv_[j] + k[i] * v[j];
    for (std::int64_t i = 0; i < K; ++i) znext[i] = zprev[i] * a_[i] + k[i];
  }

  // The update forms' token (update_form_steps.h) as the slots give it.
  update_form_steps::Token update_form_token() const {
    return {args_.key_dim, args_.value_dim, qhat_.data(), khat_.data(), row(ir::Slot::v).data(), a_.data(), beta_,
            has(ir::Slot::bonus) ? row(ir::Slot::bonus).data() : nullptr};
  }
  void advance_update_form(const float* prev, float* next) {
    const update_form_steps::Token x = update_form_token();
    if (variant_.update == ir::Update::delta) update_form_steps::delta_advance(x, prev, next, work_.data(), work_.data() + x.V);
    else update_form_steps::read_before_advance(x, prev, next);
  }

  // One token back in an update form, as back_step: dS = dL/dS_t becomes dL/dS_{t-1}; then the slots'
  // gradients through the L2 normalisation and the scale, and the chain.
  void back_step_update_form(std::int64_t b, std::int64_t t, std::int64_t h, const float* prev, const float* cur) {
    const std::int64_t K = args_.key_dim, V = args_.value_dim;
    const auto at = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    const std::vector<float>& q = row(ir::Slot::q_feature);
    const std::vector<float>& k = row(ir::Slot::k_feature);
    const TensorView& d_out = grads_.d_output;
    for (std::int64_t j = 0; j < V; ++j) do_[at(j)] = load_float(element(d_out, {b, t, h, j}), d_out.type);
    for (auto& g : g_) std::fill(g.begin(), g.end(), 0.0f);
    std::vector<float>& ga = g_[slot_index(ir::Slot::log_decay_k)];
    update_form_steps::TokenGradients grads{dqhat_.data(), dkhat_.data(), g_[slot_index(ir::Slot::v)].data(), ga.data(),
                                            g_[slot_index(ir::Slot::bonus)].data()};
    const update_form_steps::Token x = update_form_token();
    if (variant_.update == ir::Update::delta) update_form_steps::delta_back(x, prev, cur, do_.data(), dS_.data(), grads, work_.data());
    else update_form_steps::read_before_back(x, prev, do_.data(), dS_.data(), grads);
    g_[slot_index(ir::Slot::write_strength)][0] = grads.dbeta;
    float ghead = 0.0f;
    for (float d : ga) ghead += d;
    g_[slot_index(ir::Slot::log_decay_head)][0] = ghead;
    // qhat = scale r_q q and khat = r_k k, r = (sum x^2 + eps)^(-1/2) where L2-normalised (else 1):
    // d x = r dy - x r^3 (dy . x) with dy the normalised vector's gradient.
    std::vector<float>& gq = g_[slot_index(ir::Slot::q_feature)];
    std::vector<float>& gk = g_[slot_index(ir::Slot::k_feature)];
    float gscale = 0.0f, qdot = 0.0f, kdot = 0.0f;
    for (std::int64_t i = 0; i < K; ++i) {
      gscale += dqhat_[at(i)] * q_rn_ * q[at(i)];
      qdot += dqhat_[at(i)] * q[at(i)], kdot += dkhat_[at(i)] * k[at(i)];
    }
    const bool l2 = variant_.l2_normalize_qk;
    for (std::int64_t i = 0; i < K; ++i) {
      gq[at(i)] = scale_ * (q_rn_ * dqhat_[at(i)] - (l2 ? q[at(i)] * q_rn_ * q_rn_ * q_rn_ * qdot : 0.0f));
      gk[at(i)] = k_rn_ * dkhat_[at(i)] - (l2 ? k[at(i)] * k_rn_ * k_rn_ * k_rn_ * kdot : 0.0f);
    }
    g_[slot_index(ir::Slot::scale)][0] = gscale;
    chain_.token(b, t, h, g_);
  }

  // One token back: the slots' gradients from dL/do_t and dS = dL/dS_t, dS becomes dL/dS_{t-1},
  // and the inputs' gradients through the derivative programs.
  void back_step(std::int64_t b, std::int64_t t, std::int64_t h, const float* prev, const float* cur, const float* zprev, const float* zcur) {
    if (!variant_.plain_form()) return back_step_update_form(b, t, h, prev, cur);
    const std::int64_t K = args_.key_dim, V = args_.value_dim;
    const std::vector<float>& q = row(ir::Slot::q_feature);
    const std::vector<float>& k = row(ir::Slot::k_feature);
    const std::vector<float>& v = row(ir::Slot::v);
    const TensorView& d_out = grads_.d_output;
    for (std::int64_t j = 0; j < V; ++j) do_[j] = load_float(element(d_out, {b, t, h, j}), d_out.type);
    std::vector<float>& gq = g_[slot_index(ir::Slot::q_feature)];
    std::vector<float>& gk = g_[slot_index(ir::Slot::k_feature)];
    std::vector<float>& gv = g_[slot_index(ir::Slot::v)];
    std::vector<float>& ga = g_[slot_index(ir::Slot::log_decay_k)];
    std::vector<float>& gb = g_[slot_index(ir::Slot::log_decay_v)];
    float gscale = 0.0f;
    std::fill(ga.begin(), ga.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
    // o_t = scale q^T S_t (normalised: divided by scale q^T z_t + eps).
    float dden = 0.0f;
    if (variant_.normalize) {
      float den = variant_.normalize_eps;
      for (std::int64_t i = 0; i < K; ++i) den += scale_ * q[i] * zcur[i];
      std::fill(num_.begin(), num_.end(), 0.0f);
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) num_[j] += scale_ * q[i] * cur[i * V + j];
      for (std::int64_t j = 0; j < V; ++j) dden -= do_[j] * num_[j] / (den * den);
      for (std::int64_t j = 0; j < V; ++j) do_[j] /= den;  // now dL/d numerator
    }
    for (std::int64_t i = 0; i < K; ++i) {
      float r = 0.0f;
      for (std::int64_t j = 0; j < V; ++j) r += cur[i * V + j] * do_[j];
      if (variant_.normalize) r += zcur[i] * dden;
      gq[i] = scale_ * r;
      gscale += q[i] * r;
      for (std::int64_t j = 0; j < V; ++j) dS_[static_cast<std::size_t>(i * V + j)] += scale_ * q[i] * do_[j];
      if (variant_.normalize) dz_[static_cast<std::size_t>(i)] += scale_ * q[i] * dden;
    }
    // S_t = diag(a) S_{t-1} diag(b) + k v^T, z_t = a z_{t-1} + k.
    std::fill(gv.begin(), gv.end(), 0.0f);
    for (std::int64_t i = 0; i < K; ++i) {
      float gki = 0.0f;
      for (std::int64_t j = 0; j < V; ++j) {
        const float d = dS_[static_cast<std::size_t>(i * V + j)];
        gki += d * v[j];
        gv[j] += d * k[i];
        const float x = d * prev[i * V + j];
        ga[i] += x * bv_[j];
        gb[j] += x * a_[i];
        dS_[static_cast<std::size_t>(i * V + j)] = d * a_[i] * bv_[j];
      }
      gk[i] = gki;
      if (variant_.normalize) {
        gk[i] += dz_[static_cast<std::size_t>(i)];
        ga[i] += dz_[static_cast<std::size_t>(i)] * zprev[i];
        dz_[static_cast<std::size_t>(i)] *= a_[i];
      }
    }
    // The decays' slots are in log space: d log a = a da.
    float ghead = 0.0f;
    for (std::int64_t i = 0; i < K; ++i) ga[i] *= a_[i], ghead += ga[i];
    for (std::int64_t j = 0; j < V; ++j) gb[j] *= bv_[j];
    g_[slot_index(ir::Slot::log_decay_head)][0] = ghead;
    g_[slot_index(ir::Slot::scale)][0] = gscale;

    chain_.token(b, t, h, g_);
  }

  const ir::Variant& variant_;
  const RecurrentArgs& args_;
  const RecurrentGrads& grads_;
  const Programs& programs_;
  TokenLoader loader_;
  Chain chain_;
  std::vector<float> scratch_, a_, bv_, checkpoints_, z_checkpoints_, chunk_states_, chunk_z_, dS_, dz_, do_, num_;
  // The update forms: q and k as read (qhat includes the scale), their gradients, update_form_steps' work.
  std::vector<float> qhat_, khat_, dqhat_, dkhat_, work_;
  SlotRows rows_, g_;
  float scale_ = 1.0f, q_rn_ = 1.0f, k_rn_ = 1.0f, beta_ = 1.0f;
};

Programs slot_programs(const ir::Variant& variant, const RecurrentArgs& args) {
  Programs programs;
  for (std::size_t s = 0; s < ir::slot_count; ++s) {
    const ir::Slot slot = static_cast<ir::Slot>(s);
    const bool value_side = slot == ir::Slot::v || slot == ir::Slot::log_decay_v;
    if (variant.slots[s].empty()) continue;
    programs.slot[s] = RowProgram(variant, variant.slots[s], value_side ? args.value_dim : args.key_dim);
    programs.scratch = std::max(programs.scratch, programs.slot[s].scratch_size());
  }
  return programs;
}

}  // namespace

void run_recurrent(const ir::Variant& variant, const RecurrentArgs& args) {
  const Programs programs = slot_programs(variant, args);
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

void RecurrentCheckpoints::allocate(std::int64_t batch, std::int64_t tokens, const std::vector<std::int64_t>& cu_seqlens,
                                    std::int64_t heads, std::int64_t key_dim, std::int64_t value_dim) {
  const std::int64_t sequences = cu_seqlens.empty() ? batch : static_cast<std::int64_t>(cu_seqlens.size()) - 1;
  first_chunk.assign(1, 0);
  for (std::int64_t n = 0; n < sequences; ++n) {
    const std::int64_t length = cu_seqlens.empty() ? tokens : cu_seqlens[static_cast<std::size_t>(n) + 1] - cu_seqlens[static_cast<std::size_t>(n)];
    first_chunk.push_back(first_chunk.back() + (length + interval - 1) / interval);
  }
  values.assign(static_cast<std::size_t>(first_chunk.back() * heads * (key_dim * value_dim + key_dim)), 0.0f);
}

namespace {

// d slot / d input for every tensor input a slot reads whose gradient is wanted.
std::vector<GradProgram> derivative_programs(const ir::Variant& variant, const RecurrentArgs& args,
                                             const std::vector<std::optional<TensorView>>& d_tensors) {
  std::vector<GradProgram> grad_programs;
  for (std::size_t s = 0; s < ir::slot_count; ++s) {
    const ir::Expr& expr = variant.slots[s];
    if (expr.empty()) continue;
    const ir::Slot slot = static_cast<ir::Slot>(s);
    const bool value_side = slot == ir::Slot::v || slot == ir::Slot::log_decay_v;
    std::vector<bool> reads(variant.inputs.size(), false);
    for (const ir::Node& node : expr.nodes)
      if (node.op == ir::Op::input) reads[static_cast<std::size_t>(node.input)] = true;
    for (std::size_t x = 0; x < variant.inputs.size(); ++x) {
      if (!reads[x] || variant.inputs[x].kind == ir::InputKind::scalar) continue;
      if (x >= d_tensors.size() || !d_tensors[x]) continue;
      const ir::Expr d = ir::derivative(expr, static_cast<std::int32_t>(x));
      grad_programs.push_back({slot, static_cast<std::int32_t>(x), RowProgram(variant, d, value_side ? args.value_dim : args.key_dim),
                               ir::extent_of(variant.inputs[x].kind).feature != ir::Feature::none});
    }
  }
  return grad_programs;
}

// Work items that touch disjoint gradients: a sequence and a group of query heads such that heads
// in different groups read different heads of every per-token input (GQA: the heads that share k
// and v form a group); 1 where no such grouping exists. Per-head inputs are summed per worker.
std::int64_t head_groups(const ir::Variant& variant, const RecurrentArgs& args) {
  const std::int64_t H = args.heads;
  std::int64_t fewest = H;
  for (std::size_t x = 0; x < variant.inputs.size(); ++x) {
    const ir::InputKind kind = variant.inputs[x].kind;
    if (kind == ir::InputKind::scalar || kind == ir::InputKind::head) continue;
    fewest = std::min(fewest, args.tensors[x].shape[2]);
  }
  for (std::size_t x = 0; x < variant.inputs.size(); ++x) {
    const ir::InputKind kind = variant.inputs[x].kind;
    if (kind == ir::InputKind::scalar || kind == ir::InputKind::head) continue;
    const std::int64_t X = args.tensors[x].shape[2];
    for (std::int64_t h1 = 0; h1 < H; ++h1)
      for (std::int64_t h2 = 0; h2 < H; ++h2)
        if (h1 * X / H == h2 * X / H && h1 * fewest / H != h2 * fewest / H) return 1;
  }
  return fewest;
}

// Calls make_body() once per thread, then body(b, t, h) for every token of the (sequence, head
// group) items the thread takes: heads h with h * groups / H == g (groups 1: every head).
template <typename MakeBody>
void each_token(const RecurrentArgs& args, std::int64_t groups, const MakeBody& make_body) {
  const std::int64_t sequences = args.cu_seqlens.empty() ? args.batch : static_cast<std::int64_t>(args.cu_seqlens.size()) - 1;
  const std::int64_t H = args.heads;
  detail::parallel_items(sequences * groups, args.threads, [&] {
    return [body = make_body(), &args, groups, H](std::int64_t item) mutable {
      const std::int64_t n = item / groups, g = item % groups;
      const std::int64_t b = args.cu_seqlens.empty() ? n : 0;
      const std::int64_t begin = args.cu_seqlens.empty() ? 0 : args.cu_seqlens[static_cast<std::size_t>(n)];
      const std::int64_t end = args.cu_seqlens.empty() ? args.tokens : args.cu_seqlens[static_cast<std::size_t>(n) + 1];
      for (std::int64_t h = 0; h < H; ++h)
        if (groups == 1 || h * groups / H == g)
          for (std::int64_t t = begin; t < end; ++t) body(b, t, h);
    };
  });
}

}  // namespace

void run_recurrent_backward(const ir::Variant& variant, const RecurrentArgs& args, const RecurrentGrads& grads) {
  if (!grads.checkpoints) throw std::invalid_argument("run_recurrent_backward: no checkpoints (the forward makes them: RecurrentArgs::checkpoints)");
  if (grads.checkpoints->interval != Backward::C)
    throw std::invalid_argument("run_recurrent_backward: checkpoints every " + std::to_string(grads.checkpoints->interval) +
                                " tokens, expected " + std::to_string(Backward::C));
  const Programs programs = slot_programs(variant, args);
  const std::vector<GradProgram> grad_programs = derivative_programs(variant, args, grads.d_tensors);
  const std::int64_t sequences =
      args.cu_seqlens.empty() ? args.batch : static_cast<std::int64_t>(args.cu_seqlens.size()) - 1;
  const std::int64_t H = args.heads, groups = head_groups(variant, args);
  std::mutex mutex;
  std::vector<std::shared_ptr<Backward>> workers;
  detail::parallel_items(sequences * groups, args.threads, [&] {
    auto worker = std::make_shared<Backward>(variant, args, grads, programs, grad_programs);
    {
      const std::lock_guard lock(mutex);
      workers.push_back(worker);
    }
    return [worker, groups, H](std::int64_t item) {
      const std::int64_t n = item / groups, g = item % groups;
      for (std::int64_t h = 0; h < H; ++h)
        if (groups == 1 || h * groups / H == g) worker->run(n, h);
    };
  });
  for (const auto& worker : workers) worker->flush_head_grads();
}


RecurrentSlotTensors materialize_slots(const ir::Variant& variant, const RecurrentArgs& args) {
  if (!variant.plain_form())
    throw std::invalid_argument("materialize_slots: the slots of " + ir::form_name(variant) + " are not those of the diagonal form");
  const Programs programs = slot_programs(variant, args);
  const std::int64_t K = args.key_dim, V = args.value_dim, rows = args.batch * args.tokens * args.heads;
  RecurrentSlotTensors out;
  out.q.assign(static_cast<std::size_t>(rows * K), 0.0f), out.k.assign(static_cast<std::size_t>(rows * K), 0.0f);
  out.v.assign(static_cast<std::size_t>(rows * V), 0.0f), out.log_a.assign(static_cast<std::size_t>(rows * K), 0.0f);
  out.log_b.assign(static_cast<std::size_t>(rows * V), 0.0f), out.scale.assign(static_cast<std::size_t>(rows), 1.0f);
  // Every (sequence, head) writes its own rows.
  each_token(args, args.heads, [&] {
    return [&, loader = std::make_shared<TokenLoader>(variant, args),
            scratch = std::make_shared<std::vector<float>>(programs.scratch)](std::int64_t b, std::int64_t t, std::int64_t h) {
      const auto slot = [&](ir::Slot s, float* row, std::int64_t width, bool add) {
        const RowProgram& program = programs.slot[slot_index(s)];
        if (program.empty()) return;
        const float* result = program.evaluate(*loader, scratch->data());
        for (std::int64_t f = 0; f < width; ++f) {
          const float x = result[program.varies_over_features() ? f : 0];
          row[f] = add ? row[f] + x : x;
        }
      };
      loader->at(b, t, h);
      const std::int64_t r = (b * args.tokens + t) * args.heads + h;
      slot(ir::Slot::q_feature, &out.q[static_cast<std::size_t>(r * K)], K, false);
      slot(ir::Slot::k_feature, &out.k[static_cast<std::size_t>(r * K)], K, false);
      slot(ir::Slot::v, &out.v[static_cast<std::size_t>(r * V)], V, false);
      slot(ir::Slot::log_decay_k, &out.log_a[static_cast<std::size_t>(r * K)], K, true);
      slot(ir::Slot::log_decay_head, &out.log_a[static_cast<std::size_t>(r * K)], K, true);
      slot(ir::Slot::log_decay_v, &out.log_b[static_cast<std::size_t>(r * V)], V, false);
      slot(ir::Slot::scale, &out.scale[static_cast<std::size_t>(r)], 1, false);
    };
  });
  return out;
}

void chain_slot_gradients(const ir::Variant& variant, const RecurrentArgs& args, const RecurrentSlotTensors& slot_grads,
                          const std::vector<std::optional<TensorView>>& d_tensors) {
  const std::vector<GradProgram> grad_programs = derivative_programs(variant, args, d_tensors);
  const std::int64_t K = args.key_dim, V = args.value_dim;
  const auto copy = [](const std::vector<float>& from, std::int64_t r, std::int64_t width, std::vector<float>& to) {
    std::copy_n(from.begin() + r * width, width, to.begin());
  };
  // Items of disjoint gradients (head_groups); per-head inputs summed per thread, then added.
  std::mutex mutex;
  std::vector<std::shared_ptr<Chain>> chains;
  each_token(args, head_groups(variant, args), [&] {
    auto chain = std::make_shared<Chain>(variant, args, d_tensors, grad_programs);
    {
      const std::lock_guard lock(mutex);
      chains.push_back(chain);
    }
    auto g = std::make_shared<SlotRows>();
    size_slot_rows(*g, K, V);
    return [&, chain, g](std::int64_t b, std::int64_t t, std::int64_t h) {
      SlotRows& rows = *g;
      const std::int64_t r = (b * args.tokens + t) * args.heads + h;
      copy(slot_grads.q, r, K, rows[slot_index(ir::Slot::q_feature)]);
      copy(slot_grads.k, r, K, rows[slot_index(ir::Slot::k_feature)]);
      copy(slot_grads.v, r, V, rows[slot_index(ir::Slot::v)]);
      copy(slot_grads.log_a, r, K, rows[slot_index(ir::Slot::log_decay_k)]);
      copy(slot_grads.log_b, r, V, rows[slot_index(ir::Slot::log_decay_v)]);
      float head = 0.0f;
      for (float x : rows[slot_index(ir::Slot::log_decay_k)]) head += x;
      rows[slot_index(ir::Slot::log_decay_head)][0] = head;
      rows[slot_index(ir::Slot::scale)][0] = slot_grads.scale[static_cast<std::size_t>(r)];
      chain->token(b, t, h, rows);
    };
  });
  for (const auto& chain : chains) chain->flush_head_grads();
}

}  // namespace ladle::cpu
