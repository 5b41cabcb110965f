"""ladle from Python without torch: the DSL, the CPU path and its backward on numpy arrays, against
fp64 references written here, on fresh random inputs; errors name their argument."""

import numpy as np
import pytest

import ladle
from ladle import dsl

from reference import recurrence


def rand(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def custom_gate_variant():
    x, tau = dsl.token_key("x"), dsl.head_param("tau")
    return dsl.lower(dsl.read(dsl.scan(dsl.k, dsl.v).decay_k(dsl.logsigmoid(x) / tau), dsl.q, dsl.scalar("scale")), "custom_gate")


def custom_gate_reference(q, k, v, x, tau, scale, **kw):
    g = np.log(1.0 / (1.0 + np.exp(-x.astype(np.float64)))) / tau.astype(np.float64)[None, None, :, None]
    return recurrence(q, k, v, scale=scale, gk=g, **kw)


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("seed", [0, 1])
def test_custom_gate_forward_matches_fp64(seed):
    rng = np.random.default_rng(seed)
    B, T, H, K, V = 2, 37, 3, 16, 8
    q, k, x = rand(rng, B, T, H, K), rand(rng, B, T, H, K), rand(rng, B, T, H, K)
    v = rand(rng, B, T, H, V)
    tau = rng.uniform(2, 16, H).astype(np.float32)
    h0 = rand(rng, B, H, K, V)
    o, final = ladle.run_variant(custom_gate_variant(), q, k, v, {"x": x, "tau": tau}, scale=0.3, initial_state=h0,
                                 output_final_state=True, backend="cpu")
    ref_o, ref_s = custom_gate_reference(q, k, v, x, tau, 0.3, h0=h0)
    assert o.shape == (B, T, H, V) and o.dtype == np.float32
    assert rel(o, ref_o) < 2e-5
    assert rel(final, ref_s) < 2e-5


def test_packed_sequences_reverse_and_gqa():
    rng = np.random.default_rng(2)
    lengths = [5, 0, 20, 1]
    T, H, Hkv, K, V = sum(lengths), 4, 2, 8, 8
    cu = np.array([0, *np.cumsum(lengths)], np.int32)
    q, x = rand(rng, 1, T, H, K), rand(rng, 1, T, H, K)
    k, v = rand(rng, 1, T, Hkv, K), rand(rng, 1, T, Hkv, V)
    tau = rng.uniform(2, 8, H).astype(np.float32)
    o, final = ladle.run_variant(custom_gate_variant(), q, k, v, {"x": x, "tau": tau}, cu_seqlens=cu, reverse=True,
                                 output_final_state=True, backend="cpu")
    assert final.shape == (len(lengths), H, K, V)
    kk, vv = np.repeat(k, H // Hkv, axis=2), np.repeat(v, H // Hkv, axis=2)
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        sl = slice(int(a), int(b))
        ref_o, ref_s = custom_gate_reference(q[:, sl], kk[:, sl], vv[:, sl], x[:, sl], tau, K ** -0.5, reverse=True)
        if b > a:
            assert rel(o[:, sl], ref_o) < 2e-5
        assert rel(final[n], ref_s[0]) < 2e-5 if b > a else np.all(final[n] == 0)


def test_update_forms_match_fp64():
    rng = np.random.default_rng(3)
    B, T, H, K, V = 1, 29, 2, 16, 16
    q, k = rand(rng, B, T, H, K), rand(rng, B, T, H, K)
    v = rand(rng, B, T, H, V)
    g = -rng.uniform(0.01, 0.5, (B, T, H)).astype(np.float32)
    beta = rng.uniform(0, 1, (B, T, H)).astype(np.float32)
    # The gated delta rule with L2-normalised q and k, from the DSL.
    gdn = dsl.lower(dsl.read(dsl.scan(dsl.k, dsl.v).decay_head(dsl.token_head("g")).delta(dsl.token_head("beta")), dsl.q,
                             dsl.scalar("scale")).l2_normalized(), "gdn")
    o, _ = ladle.run_variant(gdn, q, k, v, {"g": g, "beta": beta}, backend="cpu")
    ref, _ = recurrence(q, k, v, scale=K ** -0.5, gh=g, beta=beta, l2=True)
    assert rel(o, ref) < 2e-5
    # RWKV6: a read before the update with a bonus, the named variant.
    w = -rng.uniform(0.01, 1.0, (B, T, H, K)).astype(np.float32)
    u = rand(rng, H, K)
    o, _ = ladle.run_variant(ladle.named_variant("rwkv6"), q, k, v, {"w": w, "u": u}, backend="cpu")
    ref, _ = recurrence(q, k, v, scale=K ** -0.5, gk=w, u=u)
    assert rel(o, ref) < 2e-5
    # KDA: the delta rule under a per-feature decay.
    gk = -rng.uniform(0.01, 0.5, (B, T, H, K)).astype(np.float32)
    o, _ = ladle.run_variant(ladle.named_variant("kda"), q, k, v, {"g": gk, "beta": beta}, backend="cpu")
    ref, _ = recurrence(q, k, v, scale=K ** -0.5, gk=gk, beta=beta)
    assert rel(o, ref) < 2e-5


def test_python_dsl_hashes_as_the_cpp_named_ops():
    g, beta = dsl.token_key("g"), dsl.token_head("beta")
    scale = dsl.scalar("scale")
    gla = dsl.lower(dsl.read(dsl.scan(dsl.k, dsl.v).decay_k(g), dsl.q, scale))
    assert gla.hash == ladle.named_variant("gla").hash
    gdn = dsl.lower(dsl.read(dsl.scan(dsl.k, dsl.v).decay_head(dsl.token_head("g")).delta(beta), dsl.q, scale).l2_normalized())
    assert gdn.hash == ladle.named_variant("gated_delta_rule", "l2norm").hash
    rwkv6 = dsl.lower(dsl.read_before(dsl.scan(dsl.k, dsl.v).decay_k(dsl.token_key("w")), dsl.q, scale).bonus(dsl.head_key("u")))
    assert rwkv6.hash == ladle.named_variant("rwkv6").hash
    assert gla.hash != gdn.hash
    assert "log_decay_k    = g" in str(gla)


def fd_gradient(f, x, index, eps=1e-3):
    plus, minus = x.copy(), x.copy()
    plus[index] += eps
    minus[index] -= eps
    return (f(plus) - f(minus)) / (2 * eps)


def test_backward_on_the_cpu_matches_finite_differences_of_fp64():
    rng = np.random.default_rng(4)
    B, T, H, K, V = 1, 23, 2, 8, 4
    q, k, x = rand(rng, B, T, H, K), rand(rng, B, T, H, K), rand(rng, B, T, H, K)
    v = rand(rng, B, T, H, V)
    tau = rng.uniform(2, 8, H).astype(np.float32)
    h0 = rand(rng, B, H, K, V)
    d_o = rand(rng, B, T, H, V)
    grads = ladle.run_variant_backward(custom_gate_variant(), q, k, v, {"x": x, "tau": tau}, d_o, scale=0.3, initial_state=h0,
                                       backend="cpu")
    assert set(grads) == {"q", "k", "v", "x", "tau", "initial_state"}
    args = {"q": q, "k": k, "v": v, "x": x, "tau": tau, "initial_state": h0}

    def loss(name):
        def f(value):
            a = {n: t.astype(np.float64) for n, t in args.items()}
            a[name] = value
            o, _ = custom_gate_reference(a["q"], a["k"], a["v"], a["x"], a["tau"], 0.3, h0=a["initial_state"])
            return float(np.sum(o * d_o))
        return f

    for name, value in args.items():
        value64 = value.astype(np.float64)
        for flat in rng.choice(value.size, size=min(12, value.size), replace=False):
            index = np.unravel_index(flat, value.shape)
            expected = fd_gradient(loss(name), value64, index)
            got = grads[name][index]
            assert abs(got - expected) <= 2e-3 * (1 + abs(expected)), (name, index, got, expected)


def test_generated_kernels_show_the_cuda_without_a_gpu():
    kernels = ladle.generated_kernels(custom_gate_variant(), batch=2, tokens=4096, heads=8, arch="sm_90a")
    assert kernels, "no kernel planned"
    first = kernels[0]
    assert 'extern "C"' in first["source"] and first["name"] in first["source"]
    assert "logsigmoid" in first["source"] or "log" in first["source"]
    assert first["role"] and first["threads"] > 0


def test_generated_kernels_compile_through_the_cache(tmp_path, monkeypatch):
    # NVRTC compiles them here, without a GPU, into the cache a later run (C++ or Python) finds.
    monkeypatch.setenv("LADLE_CACHE_DIR", str(tmp_path))
    kernels = ladle.generated_kernels(ladle.named_variant("gla"), batch=2, tokens=256, heads=2, key_dim=64, value_dim=64,
                                      arch="sm_90a", compile=True)
    assert kernels
    for kernel in kernels:
        assert ".entry " + kernel["name"] in kernel["ptx"] or kernel["name"] in kernel["ptx"]
        assert 0 < kernel["registers"] <= 255 and kernel["spill_store_bytes"] == 0, kernel["name"]
    again = ladle.generated_kernels(ladle.named_variant("gla"), batch=2, tokens=256, heads=2, key_dim=64, value_dim=64,
                                    arch="sm_90a", compile=True)
    assert all(k["from_cache"] for k in again)


def test_errors_name_the_argument():
    x = dsl.token_key("x")
    with pytest.raises(ValueError, match="key features"):
        _ = x + dsl.token_value("y")
    with pytest.raises(ValueError, match="decay_head"):
        dsl.scan(dsl.k, dsl.v).decay_head(x)
    with pytest.raises(ValueError, match="delta"):
        dsl.scan(dsl.k, dsl.v).decay_v(dsl.token_value("gv")).delta(dsl.token_head("beta"))
    with pytest.raises(ValueError, match="bonus"):
        dsl.read(dsl.scan(dsl.k, dsl.v), dsl.q).bonus(dsl.head_key("u"))
    with pytest.raises(ValueError, match="input name"):
        dsl.token_key("not a name")
    with pytest.raises(TypeError, match="expected a ladle.dsl expression"):
        dsl.scan(dsl.k, dsl.v).decay_k("g")
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 1, 8, 2, 4), rand(rng, 1, 8, 2, 4), rand(rng, 1, 8, 2, 4)
    tau = np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"x has shape \[1,8,2,3\]"):
        ladle.run_variant(custom_gate_variant(), q, k, v, {"x": rand(rng, 1, 8, 2, 3), "tau": tau}, backend="cpu")
    with pytest.raises(ValueError, match="reads x .* not given"):
        ladle.run_variant(custom_gate_variant(), q, k, v, {"tau": tau}, backend="cpu")
    with pytest.raises(TypeError, match="q: expected a tensor"):
        ladle.run_variant(custom_gate_variant(), [[1.0]], k, v, {"x": q, "tau": tau}, backend="cpu")
    with pytest.raises(ValueError, match="backend"):
        ladle.run_variant(custom_gate_variant(), q, k, v, {"x": q, "tau": tau}, backend="tpu")
    with pytest.raises(ValueError, match="no op|unknown|gla"):
        ladle.named_variant("glaa")
