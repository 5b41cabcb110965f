#include "update_form_steps.h"

#include <algorithm>

namespace ladle::cpu::update_form_steps {

void delta_advance(const Token& x, const float* prev, float* next, float* c, float* e) {
  const std::int64_t K = x.K, V = x.V;
  std::fill(c, c + V, 0.0f);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < V; ++j) c[j] += x.khat[i] * x.a[i] * prev[i * V + j];
  for (std::int64_t j = 0; j < V; ++j) e[j] = x.beta * (x.v[j] - c[j]);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < V; ++j) next[i * V + j] = x.a[i] * prev[i * V + j] + x.khat[i] * e[j];
}

void read_before_advance(const Token& x, const float* prev, float* next) {
  for (std::int64_t i = 0; i < x.K; ++i)
    for (std::int64_t j = 0; j < x.V; ++j) next[i * x.V + j] = x.a[i] * prev[i * x.V + j] + x.khat[i] * x.v[j];
}

void delta_back(const Token& x, const float* prev, const float* cur, const float* d_out, float* dS, TokenGradients& g, float* work) {
  const std::int64_t K = x.K, V = x.V;
  float *c = work, *e = work + V, *de = work + 2 * V;
  // The read after the update: o = qhat^T S_t.
  for (std::int64_t i = 0; i < K; ++i) {
    float r = 0.0f;
    for (std::int64_t j = 0; j < V; ++j) r += cur[i * V + j] * d_out[j], dS[i * V + j] += x.qhat[i] * d_out[j];
    g.dqhat[i] = r;
  }
  delta_advance(x, prev, work + 3 * V, c, e);  // c and e of this token (the state written is not kept)
  // S_t = P + k e^T: dk = dS e, de = dS^T k; e = beta (v - c): dv = beta de, dbeta = de . (v - c), dc = -beta de;
  // c = P^T k: dk += P dc, dP = dS + k dc^T; P = diag(a) S_{t-1}: d log a_i = dP_i . P_i, dS_{t-1} = diag(a) dP.
  std::fill(de, de + V, 0.0f);
  for (std::int64_t i = 0; i < K; ++i) {
    float r = 0.0f;
    for (std::int64_t j = 0; j < V; ++j) r += dS[i * V + j] * e[j], de[j] += dS[i * V + j] * x.khat[i];
    g.dkhat[i] = r;
  }
  g.dbeta = 0.0f;
  for (std::int64_t j = 0; j < V; ++j) {
    g.dv[j] = x.beta * de[j];
    g.dbeta += de[j] * (x.v[j] - c[j]);
    de[j] *= -x.beta;  // now dc
  }
  for (std::int64_t i = 0; i < K; ++i) {
    float r = 0.0f, da = 0.0f;
    for (std::int64_t j = 0; j < V; ++j) {
      const float p = x.a[i] * prev[i * V + j];
      const float dp = dS[i * V + j] + x.khat[i] * de[j];
      r += p * de[j];
      da += dp * p;
      dS[i * V + j] = x.a[i] * dp;
    }
    g.dkhat[i] += r;
    g.dlog_a[i] = da;
  }
}

void read_before_back(const Token& x, const float* prev, const float* d_out, float* dS, TokenGradients& g) {
  // o = qhat^T S_{t-1} + (qhat . diag(u) k) v, then S_t = diag(a) S_{t-1} + k v^T.
  const std::int64_t K = x.K, V = x.V;
  float weight = 0.0f, dweight = 0.0f;
  for (std::int64_t j = 0; j < V; ++j) dweight += x.v[j] * d_out[j], g.dv[j] = 0.0f;
  if (x.bonus)
    for (std::int64_t i = 0; i < K; ++i) weight += x.qhat[i] * x.bonus[i] * x.khat[i];
  for (std::int64_t i = 0; i < K; ++i) {
    float dk = 0.0f, da = 0.0f, dq = 0.0f;
    for (std::int64_t j = 0; j < V; ++j) {
      const float d = dS[i * V + j];
      dk += d * x.v[j];
      g.dv[j] += d * x.khat[i];
      da += d * prev[i * V + j];
      dq += prev[i * V + j] * d_out[j];
      dS[i * V + j] = x.a[i] * d + x.qhat[i] * d_out[j];
    }
    g.dlog_a[i] = x.a[i] * da;
    if (x.bonus) {
      dq += x.bonus[i] * x.khat[i] * dweight;
      dk += x.qhat[i] * x.bonus[i] * dweight;
      g.dbonus[i] = x.qhat[i] * x.khat[i] * dweight;
    }
    g.dqhat[i] = dq, g.dkhat[i] = dk;
  }
  if (x.bonus)
    for (std::int64_t j = 0; j < V; ++j) g.dv[j] += weight * d_out[j];
}

}  // namespace ladle::cpu::update_form_steps
