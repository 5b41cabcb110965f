"""The fp64 oracle of the Python tests: every recurrence ladle runs, one token at a time, in numpy.

    S_t = decay(S_{t-1}) + k_t v_t^T                          (the diagonal form)
    S_t = D_t S_{t-1} - beta_t k_t (k_t^T D_t S_{t-1}) + beta_t k_t v_t^T   (the delta rule; D_t the decay)
    o_t = scale q_t^T S_t;  read before the update with a bonus u: o_t = scale q_t^T (S_{t-1} + diag(u) k_t v_t^T)
"""

import numpy as np


def recurrence(q, k, v, scale, gk=None, gv=None, gh=None, beta=None, u=None, h0=None, l2=False, reverse=False):
    """q, k [B,T,H,K], v [B,T,H,V]; gk [B,T,H,K], gv [B,T,H,V], gh [B,T,H] log decays; beta [B,T,H];
    u [H,K] (a read before the update); h0 [B,H,K,V]. Returns o [B,T,H,V] and the final state, fp64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, H, K = q.shape
    V = v.shape[-1]
    if l2:
        q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6)
        k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
    S = np.zeros((B, H, K, V)) if h0 is None else np.array(h0, np.float64)
    o = np.zeros((B, T, H, V))
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for t in steps:
        D = np.ones((B, H, K, V))
        if gk is not None:
            D = D * np.exp(np.asarray(gk, np.float64)[:, t])[..., None]
        if gv is not None:
            D = D * np.exp(np.asarray(gv, np.float64)[:, t])[..., None, :]
        if gh is not None:
            D = D * np.exp(np.asarray(gh, np.float64)[:, t])[..., None, None]
        kt, vt, qt = k[:, t], v[:, t], q[:, t]
        if u is not None:
            bonus = np.asarray(u, np.float64)[None] * kt
            o[:, t] = scale * (np.einsum("bhk,bhkv->bhv", qt, S) + np.einsum("bhk,bhk->bh", qt, bonus)[..., None] * vt)
            S = D * S + kt[..., None] * vt[..., None, :]
            continue
        S = D * S
        if beta is not None:
            b = np.asarray(beta, np.float64)[:, t][..., None]
            read = np.einsum("bhk,bhkv->bhv", kt, S)
            S = S + (b * kt)[..., None] * (vt - read)[..., None, :]
        else:
            S = S + kt[..., None] * vt[..., None, :]
        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", qt, S)
    return o, S
