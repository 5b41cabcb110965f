#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "expr.h"
#include "parallel.h"
#include <ladle/tensor/dtype.h>

namespace ladle::cpu {

KeyRange key_range(const ir::AttentionVariant& variant, std::int64_t i, std::int64_t q_length, std::int64_t k_length,
                   std::int64_t window_left, std::int64_t window_right) {
  const std::int64_t diagonal = i + (k_length - q_length);  // the key aligned with query i
  KeyRange r{0, k_length};
  if (variant.causal) r.end = std::min(r.end, diagonal + 1);
  if (variant.window) {
    if (window_right >= 0) r.end = std::min(r.end, diagonal + window_right + 1);
    if (window_left >= 0) r.begin = std::max(r.begin, diagonal - window_left);
  }
  r.end = std::max(r.end, r.begin);
  return r;
}

double dropout_uniform(std::uint64_t seed, std::uint64_t sequence, std::uint64_t head, std::uint64_t i,
                       std::uint64_t j) {
  std::uint64_t x = seed ^ (sequence * 0x9E3779B97F4A7C15ull) ^ (head * 0xC2B2AE3D27D4EB4Full) ^
                    (i * 0x165667B19E3779F9ull) ^ (j * 0xD6E8FEB86659FD93ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x = x ^ (x >> 31);
  return static_cast<double>(x >> 40) * 0x1p-24;
}

namespace {

constexpr std::int64_t key_chunk = 64;  // keys per evaluation of the score program
constexpr std::int64_t query_block = 32;  // query rows per work item

// Any element as float (pair inputs may be u8 masks).
float element(const TensorView& view, std::int64_t offset) {
  const auto* p = static_cast<const std::byte*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.type));
  switch (view.type) {
    case DType::u8: return static_cast<float>(*reinterpret_cast<const std::uint8_t*>(p));
    case DType::i32: {
      std::int32_t x;
      std::memcpy(&x, p, sizeof x);
      return static_cast<float>(x);
    }
    case DType::i64: {
      std::int64_t x;
      std::memcpy(&x, p, sizeof x);
      return static_cast<float>(x);
    }
    case DType::f64: {
      double x;
      std::memcpy(&x, p, sizeof x);
      return static_cast<float>(x);
    }
    default: return load_float(p, view.type);
  }
}

// Where the score and keep programs are: one query row, a chunk of keys.
struct Position {
  std::int64_t b = 0, n = 0, h = 0;
  std::int64_t i = 0;            // query, in its sequence
  std::int64_t q_global = 0;     // query, on the packed axis
  std::int64_t k_global0 = 0;    // first key of the chunk, on the packed axis
  std::int64_t j0 = 0;           // first key of the chunk, in its sequence
  std::int64_t last = 0;         // the chunk's last valid key offset (later lanes repeat it)
  const float* scores = nullptr;  // the chunk's q_i . k_j
};

class Loader final : public InputLoader {
 public:
  Loader(const ir::AttentionVariant& variant, const AttentionArgs& args, const Position& at)
      : variant_(variant), args_(args), at_(at) {}

  void load(std::int32_t index, float* out, std::int64_t n) const override {
    const TensorView& t = args_.tensors[index];
    switch (variant_.inputs[index].kind) {
      case ir::InputKind::scalar: out[0] = args_.scalars[index]; return;
      case ir::InputKind::head: out[0] = element(t, at_.b * t.strides[0] + at_.h * t.strides[1]); return;
      case ir::InputKind::pair: {
        const std::int64_t row = at_.b * t.strides[0] + at_.h * t.strides[1] + at_.q_global * t.strides[2];
        for (std::int64_t c = 0; c < n; ++c)
          out[c] = element(t, row + (at_.k_global0 + std::min(c, at_.last)) * t.strides[3]);
        return;
      }
      default: out[0] = 0; return;  // validate() keeps q, k, v out of expressions
    }
  }
  void load_leaf(ir::Op leaf, float* out, std::int64_t n) const override {
    switch (leaf) {
      case ir::Op::score: std::copy(at_.scores, at_.scores + n, out); return;
      case ir::Op::key_index:
        for (std::int64_t c = 0; c < n; ++c) out[c] = static_cast<float>(at_.j0 + std::min(c, at_.last));
        return;
      case ir::Op::query_index: out[0] = static_cast<float>(at_.i); return;
      case ir::Op::head_index: out[0] = static_cast<float>(at_.h); return;
      case ir::Op::batch_index: out[0] = static_cast<float>(at_.n); return;
      default: out[0] = 0; return;
    }
  }

 private:
  const ir::AttentionVariant& variant_;
  const AttentionArgs& args_;
  const Position& at_;
};

bool varies_over_keys(const ir::AttentionVariant& variant, const ir::Node& leaf) {
  if (leaf.op == ir::Op::input) return variant.inputs[leaf.input].kind == ir::InputKind::pair;
  return leaf.op == ir::Op::score || leaf.op == ir::Op::key_index;
}

// What the forward and the backward share per query row: k and v of a work item widened to fp32,
// the row's logits as the score expression, the keep predicate and the segment ids leave them, and
// the sinks' logits with the row's maximum.
class RowLogits {
 public:
  RowLogits(const ir::AttentionVariant& variant, const AttentionArgs& args)
      : variant_(variant), args_(args),
        score_(variant.score, key_chunk, [&](const ir::Node& n) { return varies_over_keys(variant, n); }) {
    if (!variant.keep.empty())
      keep_ = RowProgram(variant.keep, key_chunk, [&](const ir::Node& n) { return varies_over_keys(variant, n); });
    scratch_.resize(std::max(score_.scratch_size(), keep_.scratch_size()));
    chunk_scores_.resize(key_chunk);
  }

 protected:
  // k and v rows of (b, hk) as fp32, once per work item.
  void widen_keys(std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t Lk) {
    const AttentionArgs& a = args_;
    keys_.resize(static_cast<std::size_t>(Lk * a.D));
    values_.resize(static_cast<std::size_t>(Lk * a.Dv));
    for (std::int64_t j = 0; j < Lk; ++j) {
      const std::int64_t k_offset = b * a.k.strides[0] + (k0 + j) * a.k.strides[1] + hk * a.k.strides[2];
      for (std::int64_t d = 0; d < a.D; ++d) keys_[static_cast<std::size_t>(j * a.D + d)] = element(a.k, k_offset + d * a.k.strides[3]);
      const std::int64_t v_offset = b * a.v.strides[0] + (k0 + j) * a.v.strides[1] + hk * a.v.strides[2];
      for (std::int64_t d = 0; d < a.Dv; ++d) values_[static_cast<std::size_t>(j * a.Dv + d)] = element(a.v, v_offset + d * a.v.strides[3]);
    }
  }

  // Calls body(j0, count, loader) for each chunk of the row's keys, the raw scores in place.
  template <typename Body>
  void for_chunks(Position& at, const KeyRange& range, const std::vector<float>& q_row, const Body& body) {
    const AttentionArgs& a = args_;
    for (std::int64_t j0 = range.begin; j0 < range.end; j0 += key_chunk) {
      const std::int64_t count = std::min(key_chunk, range.end - j0);
      for (std::int64_t c = 0; c < key_chunk; ++c) {
        const float* key = &keys_[static_cast<std::size_t>((j0 + std::min(c, count - 1)) * a.D)];
        float dot = 0;
        for (std::int64_t d = 0; d < a.D; ++d) dot += q_row[static_cast<std::size_t>(d)] * key[d];
        chunk_scores_[static_cast<std::size_t>(c)] = dot;
      }
      at.j0 = j0;
      at.k_global0 = a.k_begin(at.n) + j0;
      at.last = count - 1;
      at.scores = chunk_scores_.data();
      const Loader loader(variant_, a, at);
      body(j0, count, loader);
    }
  }

  // logits_ for query row at.i over the keys of `range` (-inf where dropped).
  void form_logits(Position& at, const KeyRange& range, const std::vector<float>& q_row) {
    const AttentionArgs& a = args_;
    constexpr float minus_inf = -std::numeric_limits<float>::infinity();
    logits_.assign(static_cast<std::size_t>(range.end - range.begin), minus_inf);
    for_chunks(at, range, q_row, [&](std::int64_t j0, std::int64_t count, const Loader& loader) {
      const float* logit = score_.evaluate(loader, scratch_.data());
      const bool logit_row = score_.varies_over_features();
      for (std::int64_t c = 0; c < count; ++c) logits_[static_cast<std::size_t>(j0 - range.begin + c)] = logit[logit_row ? c : 0];
      if (!keep_.empty()) {
        const float* keep = keep_.evaluate(loader, scratch_.data());
        const bool keep_row = keep_.varies_over_features();
        for (std::int64_t c = 0; c < count; ++c)
          if (keep[keep_row ? c : 0] == 0.0f) logits_[static_cast<std::size_t>(j0 - range.begin + c)] = minus_inf;
      }
    });
    if (variant_.segment_ids) {
      const TensorView& qs = *a.q_segment_ids;
      const TensorView& ks = *a.kv_segment_ids;
      const std::int64_t mine = load_integer(qs, at.b * qs.strides[0] + at.q_global * qs.strides[1]);
      const std::int64_t k0 = a.k_begin(at.n);
      for (std::int64_t j = range.begin; j < range.end; ++j)
        if (load_integer(ks, at.b * ks.strides[0] + (k0 + j) * ks.strides[1]) != mine)
          logits_[static_cast<std::size_t>(j - range.begin)] = minus_inf;
    }
  }

  // The sinks' logits of head h into `sinks`; returns the row's maximum over logits_ and them.
  float row_max(std::int64_t h, std::vector<float>& sinks) const {
    float best = -std::numeric_limits<float>::infinity();
    for (float x : logits_) best = std::max(best, x);
    sinks.clear();
    if (variant_.sinks) {
      const TensorView& aux = *args_.softmax_aux;
      for (std::int64_t s = 0; s < args_.sinks; ++s) {
        sinks.push_back(element(aux, h * aux.strides[0] + s * aux.strides[1]));
        best = std::max(best, sinks.back());
      }
    }
    return best;
  }

  const ir::AttentionVariant& variant_;
  const AttentionArgs& args_;
  RowProgram score_, keep_;
  std::vector<float> scratch_, chunk_scores_, keys_, values_, logits_;
};

// One thread's state: the programs' scratch, a widened copy of q's row, keys and values.
class Worker : RowLogits {
 public:
  Worker(const ir::AttentionVariant& variant, const AttentionArgs& args) : RowLogits(variant, args) {
    q_row_.resize(static_cast<std::size_t>(args.D));
    o_row_.resize(static_cast<std::size_t>(args.Dv));
  }

  // Query rows [block * query_block, ...) of sequence n, head h.
  void run(std::int64_t n, std::int64_t h, std::int64_t block) {
    const AttentionArgs& a = args_;
    const std::int64_t hk = h / (a.H / a.H_kv);
    const std::int64_t b = a.batch_of(n), q0 = a.q_begin(n), k0 = a.k_begin(n);
    const std::int64_t Lq = a.q_length(n), Lk = a.k_length(n);
    const std::int64_t first = block * query_block, stop = std::min(Lq, first + query_block);
    if (first >= stop) return;
    widen_keys(b, hk, k0, Lk);
    Position at;
    at.b = b;
    at.n = n;
    at.h = h;
    for (std::int64_t i = first; i < stop; ++i) {
      at.i = i;
      at.q_global = q0 + i;
      const std::int64_t q_offset = b * a.q.strides[0] + (q0 + i) * a.q.strides[1] + h * a.q.strides[2];
      for (std::int64_t d = 0; d < a.D; ++d) q_row_[d] = element(a.q, q_offset + d * a.q.strides[3]);
      const KeyRange range = key_range(variant_, i, Lq, Lk, a.window_left, a.window_right);
      form_logits(at, range, q_row_);
      finish_row(n, h, b, q0 + i, i, range);
    }
  }

 private:
  // Softmax over the row's logits (sinks in the denominator), dropout, P V, lse.
  void finish_row(std::int64_t n, std::int64_t h, std::int64_t b, std::int64_t q_global, std::int64_t i,
                  const KeyRange& range) {
    const AttentionArgs& a = args_;
    constexpr float minus_inf = -std::numeric_limits<float>::infinity();
    std::vector<float> sinks;
    const float row_max = this->row_max(h, sinks);
    std::fill(o_row_.begin(), o_row_.end(), 0.0f);
    float lse = minus_inf;
    if (row_max != minus_inf) {
      float row_sum = 0;
      for (float& x : logits_) {
        x = std::exp(x - row_max);  // p before normalisation
        row_sum += x;
      }
      for (float s : sinks) row_sum += std::exp(s - row_max);
      lse = row_max + std::log(row_sum);
      const float keep_scale = variant_.dropout ? 1.0f / (1.0f - a.dropout_p) : 1.0f;
      for (std::int64_t j = range.begin; j < range.end; ++j) {
        float p = logits_[j - range.begin] / row_sum;
        if (p == 0.0f) continue;
        if (variant_.dropout && a.dropout_p > 0) {
          if (dropout_uniform(a.seed, n, h, i, j) < a.dropout_p) continue;
          p *= keep_scale;
        }
        const float* value = &values_[static_cast<std::size_t>(j * a.Dv)];
        for (std::int64_t d = 0; d < a.Dv; ++d) o_row_[d] += p * value[d];
      }
    }
    const auto* base = static_cast<std::byte*>(a.o.data);
    const std::size_t size = dtype_size(a.o.type);
    const std::int64_t o_offset = b * a.o.strides[0] + q_global * a.o.strides[1] + h * a.o.strides[2];
    for (std::int64_t d = 0; d < a.Dv; ++d)
      store_float(const_cast<std::byte*>(base) + (o_offset + d * a.o.strides[3]) * static_cast<std::int64_t>(size),
                          a.o.type, o_row_[d]);
    if (a.lse) {
      const TensorView& l = *a.lse;
      auto* out = static_cast<float*>(l.data) + b * l.strides[0] + h * l.strides[1] + q_global * l.strides[2];
      *out = lse;
    }
  }

  std::vector<float> q_row_, o_row_;
};

float& grad_at(const TensorView& view, std::int64_t offset) { return static_cast<float*>(view.data)[offset]; }

// d logit / d (raw score or an input) for the score expression, and the input it is for (-1: score).
struct ScoreDerivative {
  std::int32_t input;
  RowProgram program;
};

// The backward of one query row at a time.
class BackwardWorker : RowLogits {
 public:
  BackwardWorker(const ir::AttentionVariant& variant, const AttentionArgs& args, const AttentionGrads& grads)
      : RowLogits(variant, args), grads_(grads) {
    const auto varies = [&](const ir::Node& n) { return varies_over_keys(variant, n); };
    derivatives_.push_back({-1, RowProgram(ir::derivative(variant.score, ir::Op::score), key_chunk, varies)});
    std::vector<bool> reads(variant.inputs.size(), false);
    for (const ir::Node& node : variant.score.nodes)
      if (node.op == ir::Op::input) reads[static_cast<std::size_t>(node.input)] = true;
    for (std::size_t x = 0; x < variant.inputs.size(); ++x)
      if (reads[x] && variant.inputs[x].kind != ir::InputKind::scalar && x < grads.d_tensors.size() && grads.d_tensors[x])
        derivatives_.push_back({static_cast<std::int32_t>(x),
                                RowProgram(ir::derivative(variant.score, static_cast<std::int32_t>(x)), key_chunk, varies)});
    std::size_t scratch = scratch_.size();
    for (const ScoreDerivative& d : derivatives_) scratch = std::max(scratch, d.program.scratch_size());
    scratch_.resize(scratch);
  }

  void run(std::int64_t n, std::int64_t h) {
    const AttentionArgs& a = args_;
    const std::int64_t hk = h / (a.H / a.H_kv);
    const std::int64_t b = a.batch_of(n), q0 = a.q_begin(n), k0 = a.k_begin(n);
    const std::int64_t Lq = a.q_length(n), Lk = a.k_length(n);
    widen_keys(b, hk, k0, Lk);
    std::vector<float> q_row(static_cast<std::size_t>(a.D)), do_row(static_cast<std::size_t>(a.Dv)), dq_row(static_cast<std::size_t>(a.D));
    Position at;
    at.b = b, at.n = n, at.h = h;
    constexpr float minus_inf = -std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < Lq; ++i) {
      at.i = i;
      at.q_global = q0 + i;
      const std::int64_t q_offset = b * a.q.strides[0] + (q0 + i) * a.q.strides[1] + h * a.q.strides[2];
      for (std::int64_t d = 0; d < a.D; ++d) q_row[static_cast<std::size_t>(d)] = element(a.q, q_offset + d * a.q.strides[3]);
      const TensorView& g = grads_.d_output;
      const std::int64_t do_offset = b * g.strides[0] + (q0 + i) * g.strides[1] + h * g.strides[2];
      for (std::int64_t d = 0; d < a.Dv; ++d) do_row[static_cast<std::size_t>(d)] = element(g, do_offset + d * g.strides[3]);
      const KeyRange range = key_range(variant_, i, Lq, Lk, a.window_left, a.window_right);
      const std::int64_t width = range.end - range.begin;
      // The logits and the softmax (sinks in the denominator), as the forward forms them: p_j, then
      // dP_j = keep_j (do . v_j) and delta = sum p dP.
      form_logits(at, range, q_row);
      std::vector<float> sinks;
      const float row_max = this->row_max(h, sinks);
      if (row_max == minus_inf) continue;  // nothing kept: o = 0, no gradient
      float row_sum = 0.0f;
      for (float x : logits_) row_sum += std::exp(x - row_max);
      for (float s : sinks) row_sum += std::exp(s - row_max);
      const float lse = row_max + std::log(row_sum);
      const float keep_scale = variant_.dropout ? 1.0f / (1.0f - a.dropout_p) : 1.0f;
      dlogits_.assign(static_cast<std::size_t>(width), 0.0f);
      float delta = 0.0f;
      for (std::int64_t j = range.begin; j < range.end; ++j) {
        const float p = std::exp(logits_[static_cast<std::size_t>(j - range.begin)] - lse);
        if (p == 0.0f) continue;
        float keep = 1.0f;
        if (variant_.dropout && a.dropout_p > 0) keep = dropout_uniform(a.seed, n, h, i, j) < a.dropout_p ? 0.0f : keep_scale;
        const float* value = &values_[static_cast<std::size_t>(j * a.Dv)];
        float dp = 0.0f;
        for (std::int64_t d = 0; d < a.Dv; ++d) dp += do_row[static_cast<std::size_t>(d)] * value[d];
        dp *= keep;
        // dv_j += p keep do
        if (keep != 0.0f) {
          const TensorView& dv = grads_.dv;
          const std::int64_t off = b * dv.strides[0] + (k0 + j) * dv.strides[1] + hk * dv.strides[2];
          for (std::int64_t d = 0; d < a.Dv; ++d) grad_at(dv, off + d * dv.strides[3]) += p * keep * do_row[static_cast<std::size_t>(d)];
        }
        dlogits_[static_cast<std::size_t>(j - range.begin)] = dp;  // p (dP - delta) below
        delta += p * dp;
      }
      for (std::int64_t j = range.begin; j < range.end; ++j) {
        float& dl = dlogits_[static_cast<std::size_t>(j - range.begin)];
        const float p = std::exp(logits_[static_cast<std::size_t>(j - range.begin)] - lse);
        dl = p == 0.0f ? 0.0f : p * (dl - delta);
      }
      if (grads_.d_softmax_aux)
        for (std::int64_t s = 0; s < a.sinks; ++s) {
          const TensorView& da = *grads_.d_softmax_aux;
          own(sinks_grad_, da, h * da.strides[0] + s * da.strides[1]) -= std::exp(sinks[static_cast<std::size_t>(s)] - lse) * delta;
        }
      // Through the score expression: d raw score (to q and k), d each input it reads.
      std::fill(dq_row.begin(), dq_row.end(), 0.0f);
      for_chunks(at, range, q_row, [&](std::int64_t j0, std::int64_t count, const Loader& loader) {
        for (const ScoreDerivative& sd : derivatives_) {
          const float* dvalue = sd.program.evaluate(loader, scratch_.data());
          const bool row = sd.program.varies_over_features();
          float total = 0.0f;
          for (std::int64_t c = 0; c < count; ++c) {
            const float dl = dlogits_[static_cast<std::size_t>(j0 - range.begin + c)];
            if (dl == 0.0f) continue;
            const float x = dl * dvalue[row ? c : 0];
            const std::int64_t j = j0 + c;
            if (sd.input < 0) {  // the raw score q_i . k_j
              const float* key = &keys_[static_cast<std::size_t>(j * a.D)];
              for (std::int64_t d = 0; d < a.D; ++d) dq_row[static_cast<std::size_t>(d)] += x * key[d];
              const TensorView& dk = grads_.dk;
              const std::int64_t off = b * dk.strides[0] + (k0 + j) * dk.strides[1] + hk * dk.strides[2];
              for (std::int64_t d = 0; d < a.D; ++d) grad_at(dk, off + d * dk.strides[3]) += x * q_row[static_cast<std::size_t>(d)];
            } else if (variant_.inputs[static_cast<std::size_t>(sd.input)].kind == ir::InputKind::pair) {
              const TensorView& dt = *grads_.d_tensors[static_cast<std::size_t>(sd.input)];
              own(input_grads_[static_cast<std::size_t>(sd.input)], dt,
                  b * dt.strides[0] + h * dt.strides[1] + (q0 + i) * dt.strides[2] + (k0 + j) * dt.strides[3]) += x;
            } else {
              total += x;
            }
          }
          if (sd.input >= 0 && variant_.inputs[static_cast<std::size_t>(sd.input)].kind == ir::InputKind::head) {
            const TensorView& dt = *grads_.d_tensors[static_cast<std::size_t>(sd.input)];
            own(input_grads_[static_cast<std::size_t>(sd.input)], dt, b * dt.strides[0] + h * dt.strides[1]) += total;
          }
        }
      });
      const TensorView& dq = grads_.dq;
      const std::int64_t dq_offset = b * dq.strides[0] + (q0 + i) * dq.strides[1] + h * dq.strides[2];
      for (std::int64_t d = 0; d < a.D; ++d) grad_at(dq, dq_offset + d * dq.strides[3]) += dq_row[static_cast<std::size_t>(d)];
    }
  }

  // Adds this worker's sums of the shared gradients (inputs of the score, sinks) into their memory.
  void flush() const {
    const auto add = [](const std::vector<float>& mine, const TensorView& view) {
      for (std::size_t e = 0; e < mine.size(); ++e) static_cast<float*>(view.data)[e] += mine[e];
    };
    for (std::size_t x = 0; x < input_grads_.size(); ++x)
      if (!input_grads_[x].empty()) add(input_grads_[x], *grads_.d_tensors[x]);
    if (grads_.d_softmax_aux) add(sinks_grad_, *grads_.d_softmax_aux);
  }

 private:
  // Memory elements a canonical view (broadcast axes at stride 0) spans.
  static std::size_t span(const TensorView& view) {
    std::int64_t last = 0;
    for (int d = 0; d < view.rank(); ++d) last += (view.shape[static_cast<std::size_t>(d)] - 1) * view.strides[static_cast<std::size_t>(d)];
    return static_cast<std::size_t>(last + 1);
  }
  // This worker's copy of a gradient that several work items add to (a broadcast bias, a per-head
  // slope, the sinks), at the element `offset` of its view.
  static float& own(std::vector<float>& mine, const TensorView& view, std::int64_t offset) {
    if (mine.empty()) mine.assign(span(view), 0.0f);
    return mine[static_cast<std::size_t>(offset)];
  }

  const AttentionGrads& grads_;
  std::vector<ScoreDerivative> derivatives_;
  std::vector<float> dlogits_, sinks_grad_;
  std::vector<std::vector<float>> input_grads_ = std::vector<std::vector<float>>(variant_.inputs.size());
};

}  // namespace

void run_attention(const ir::AttentionVariant& variant, const AttentionArgs& args) {
  std::int64_t longest = 0;
  for (std::int64_t n = 0; n < args.N; ++n) longest = std::max(longest, args.q_length(n));
  const std::int64_t blocks = (longest + query_block - 1) / query_block;
  const std::int64_t items = args.N * args.H * blocks;
  detail::parallel_items(items, args.threads, [&] {
    return [worker = std::make_shared<Worker>(variant, args), &args, blocks](std::int64_t item) {
      const std::int64_t block = item % blocks, pair = item / blocks;
      worker->run(pair / args.H, pair % args.H, block);
    };
  });
}

void run_attention_backward(const ir::AttentionVariant& variant, const AttentionArgs& args, const AttentionGrads& grads) {
  // Items of one sequence and one k/v head (the query heads that share it): dq, dk and dv are
  // disjoint between items; gradients broadcast inputs share are summed per worker, then added.
  std::mutex mutex;
  std::vector<std::shared_ptr<BackwardWorker>> workers;
  const std::int64_t group = args.H / args.H_kv;
  detail::parallel_items(args.N * args.H_kv, args.threads, [&] {
    auto worker = std::make_shared<BackwardWorker>(variant, args, grads);
    {
      const std::lock_guard lock(mutex);
      workers.push_back(worker);
    }
    return [worker, &args, group](std::int64_t item) {
      const std::int64_t n = item / args.H_kv, hk = item % args.H_kv;
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) worker->run(n, h);
    };
  });
  for (const auto& worker : workers) worker->flush();
}

}  // namespace ladle::cpu
