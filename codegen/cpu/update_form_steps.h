// One token of the update forms (the delta rule, KDA, a read before the update with RWKV6's bonus)
// on one (sequence, head) state S [K,V], in fp32, forward and back: what the CPU backward
// (recurrent.cpp, Backward) steps through between its checkpoints. The operands are as the
// recurrence reads them: q times the scale, q and k after any L2 normalisation, each row's decay.
#pragma once

#include <cstdint>

namespace ladle::cpu::update_form_steps {

struct Token {
  std::int64_t K = 0, V = 0;
  const float* qhat = nullptr;   // [K]: scale times q (L2-normalised where asked)
  const float* khat = nullptr;   // [K]
  const float* v = nullptr;      // [V]
  const float* a = nullptr;      // [K]: each row's decay, exp(log_decay_k + log_decay_head)
  float beta = 1.0f;             // the delta rule's write strength
  const float* bonus = nullptr;  // [K]: a read before the update's bonus u, or null
};

// The gradients of one token's operands, written (not added): dqhat, dkhat and dlog_a [K] (the
// gradient of each row's log decay), dv [V], dbonus [K] where the token has a bonus, dbeta.
struct TokenGradients {
  float *dqhat = nullptr, *dkhat = nullptr, *dv = nullptr, *dlog_a = nullptr, *dbonus = nullptr;
  float dbeta = 0.0f;
};

// The delta rule, read after the update: P = diag(a) prev, c = P^T khat, e = beta (v - c),
// next = P + khat e^T (c and e [V] are written too).
void delta_advance(const Token& x, const float* prev, float* next, float* c, float* e);
// A read before the update: next = diag(a) prev + khat v^T.
void read_before_advance(const Token& x, const float* prev, float* next);

// One token back: d_out = dL/do_t; dS holds dL/dS_t and becomes dL/dS_{t-1}. prev = S_{t-1}, cur = S_t.
// work: 3 V + K V floats.
void delta_back(const Token& x, const float* prev, const float* cur, const float* d_out, float* dS, TokenGradients& g, float* work);
void read_before_back(const Token& x, const float* prev, const float* d_out, float* dS, TokenGradients& g);

}  // namespace ladle::cpu::update_form_steps
