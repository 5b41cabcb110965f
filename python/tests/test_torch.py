"""ladle.torch: fla's names and DSL variants as torch custom ops, against an fp64 oracle written in
torch (autograd gives its gradients), on fresh random inputs. Marked `torch`; the CUDA ones also
`gpu` (they run on the GPU machine: bench/python-check.sh). Without torch, or without a GPU, pytest
reports each skipped test with its reason (the README's test command passes -rs)."""

import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed here: the torch tests run on the GPU machine")

import ladle  # noqa: E402
import ladle.torch as lt  # noqa: E402
from ladle import dsl  # noqa: E402

pytestmark = pytest.mark.torch
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: runs on the GPU machine")


def oracle(q, k, v, scale, gk=None, gv=None, gh=None, beta=None, u=None, h0=None, l2=False):
    """The recurrence one token at a time in fp64 (differentiable): see tests/reference.py."""
    q, k, v = q.double(), k.double(), v.double()
    B, T, H, K = q.shape
    V = v.shape[-1]
    if l2:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    S = torch.zeros(B, H, K, V, dtype=torch.float64, device=q.device) if h0 is None else h0.double()
    outs = []
    for t in range(T):
        D = torch.ones(B, H, K, V, dtype=torch.float64, device=q.device)
        if gk is not None:
            D = D * gk[:, t].double().exp()[..., None]
        if gv is not None:
            D = D * gv[:, t].double().exp()[..., None, :]
        if gh is not None:
            D = D * gh[:, t].double().exp()[..., None, None]
        kt, vt, qt = k[:, t], v[:, t], q[:, t]
        if u is not None:
            bonus = (u.double()[None] * kt * qt).sum(-1, keepdim=True)
            outs.append(scale * (torch.einsum("bhk,bhkv->bhv", qt, S) + bonus * vt))
            S = D * S + kt[..., None] * vt[..., None, :]
            continue
        S = D * S
        if beta is not None:
            b = beta[:, t].double()[..., None]
            S = S + (b * kt)[..., None] * (vt - torch.einsum("bhk,bhkv->bhv", kt, S))[..., None, :]
        else:
            S = S + kt[..., None] * vt[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", qt, S))
    return torch.stack(outs, 1), S


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def leaf(x):
    return x.detach().clone().requires_grad_(True)


def grads_of(outputs, inputs, d_outputs):
    return torch.autograd.grad(outputs, inputs, d_outputs, allow_unused=True)


def check(fn, ref, args, tol_o, tol_g, names, backward=True):
    """fn and ref on the same leaves; o, the final state and every gradient compared."""
    ours = [leaf(a) for a in args]
    theirs = [leaf(a.detach().double().cpu()) for a in args]
    o, s = fn(*ours)
    ro, rs = ref(*theirs)
    assert rel(o.cpu(), ro) < tol_o, f"o: {rel(o.cpu(), ro)}"
    assert rel(s.cpu(), rs) < tol_o, f"final state: {rel(s.cpu(), rs)}"
    if not backward:
        return
    do = torch.randn_like(ro)
    ds = torch.randn_like(rs)
    g_ours = grads_of((o, s), ours, (do.to(o.device, o.dtype), ds.to(s.device, s.dtype)))
    g_ref = grads_of((ro, rs), theirs, (do, ds))
    for name, a, b in zip(names, g_ours, g_ref):
        assert a is not None and a.dtype == ours[names.index(name)].dtype, name
        assert rel(a.cpu(), b) < tol_g, f"d{name}: {rel(a.cpu(), b)}"


def shapes(device, dtype, B=2, T=70, H=2, K=32, V=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device, dtype)  # noqa: E731
    return r, (B, T, H, K, V)


# --- the CPU path (fp32) ---------------------------------------------------------------------------


def test_chunk_gla_forward_and_gradients_on_the_cpu():
    r, (B, T, H, K, V) = shapes("cpu", torch.float32)
    q, k, v, h0 = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), r(B, H, K, V)
    g = torch.nn.functional.logsigmoid(r(B, T, H, K)) / 8
    check(lambda q, k, v, g, h0: lt.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True),
          lambda q, k, v, g, h0: oracle(q, k, v, K ** -0.5, gk=g, h0=h0),
          (q, k, v, g, h0), 1e-5, 1e-4, ["q", "k", "v", "g", "initial_state"])


def test_dsl_variant_with_a_user_gate_on_the_cpu():
    x, tau = dsl.token_key("x"), dsl.head_param("tau")
    variant = dsl.lower(dsl.read(dsl.scan(dsl.k, dsl.v).decay_k(dsl.logsigmoid(x) / tau), dsl.q, dsl.scalar("scale")), "gate")
    r, (B, T, H, K, V) = shapes("cpu", torch.float32, seed=1)
    args = (r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), r(B, T, H, K), torch.rand(H) * 8 + 2)

    def ours(q, k, v, x_, tau_):
        o, s = lt.run_variant(variant, q, k, v, {"x": x_, "tau": tau_}, scale=0.25, output_final_state=True)
        return o, s

    def ref(q, k, v, x_, tau_):
        return oracle(q, k, v, 0.25, gk=torch.nn.functional.logsigmoid(x_) / tau_[None, None, :, None])

    check(ours, ref, args, 1e-5, 1e-4, ["q", "k", "v", "x", "tau"])


def test_update_forms_on_the_cpu():
    r, (B, T, H, K, V) = shapes("cpu", torch.float32, T=40, seed=2)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    g = -torch.rand(B, T, H) * 0.5
    beta = torch.rand(B, T, H)
    check(lambda q, k, v, g, b: lt.chunk_gated_delta_rule(q, k, v, g, b, use_qk_l2norm_in_kernel=True, output_final_state=True),
          lambda q, k, v, g, b: oracle(q, k, v, K ** -0.5, gh=g, beta=b, l2=True), (q, k, v, g, beta), 1e-5, 1e-4,
          ["q", "k", "v", "g", "beta"])
    w, u = -torch.rand(B, T, H, K), r(H, K)
    check(lambda q, k, v, w, u: lt.chunk_rwkv6(q, k, v, w, u, output_final_state=True),
          lambda q, k, v, w, u: oracle(q, k, v, K ** -0.5, gk=w, u=u), (q, k, v, w, u), 1e-5, 1e-4, ["r", "k", "v", "w", "u"])


def test_fused_recurrent_forms_match_the_oracle_on_the_cpu():
    r, (B, T, H, K, V) = shapes("cpu", torch.float32, T=30, seed=16)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    gh, beta, gk, u = -torch.rand(B, T, H) * 0.5, torch.rand(B, T, H), -torch.rand(B, T, H, K) * 0.5, r(H, K)
    kn = torch.nn.functional.normalize(k, dim=-1)
    cases = [
        (lambda: lt.fused_recurrent_simple_gla(q, k, v, g=gh, output_final_state=True), oracle(q, k, v, K ** -0.5, gh=gh)),
        (lambda: lt.fused_recurrent_delta_rule(q, kn, v, beta, output_final_state=True), oracle(q, kn, v, K ** -0.5, beta=beta)),
        (lambda: lt.fused_recurrent_gated_delta_rule(q, k, v, g=gh, beta=beta, use_qk_l2norm_in_kernel=True, output_final_state=True),
         oracle(q, k, v, K ** -0.5, gh=gh, beta=beta, l2=True)),
        (lambda: lt.fused_recurrent_rwkv6(q, k, v, gk, u, output_final_state=True), oracle(q, k, v, K ** -0.5, gk=gk, u=u)),
        (lambda: lt.fused_recurrent_kda(q, k, v, gk, beta, use_qk_l2norm_in_kernel=True, output_final_state=True),
         oracle(q, k, v, K ** -0.5, gk=gk, beta=beta, l2=True)),
    ]
    for n, (ours, (ro, rs)) in enumerate(cases):
        o, s_ = ours()
        assert rel(o, ro) < 1e-5 and rel(s_, rs) < 1e-5, n
    with pytest.raises(ValueError, match="fused_recurrent_kda"):
        lt.fused_recurrent_gated_delta_rule(q, k, v, gk=gk, beta=beta)
    with pytest.raises(ValueError, match="beta"):
        lt.fused_recurrent_delta_rule(q, k, v)


def test_custom_op_registration_passes_opcheck():
    r, (B, T, H, K, V) = shapes("cpu", torch.float32, T=20, seed=3)
    key = lt.register_variant(ladle.named_variant("gla"))
    q, k, v, g = r(B, T, H, K).requires_grad_(), r(B, T, H, K).requires_grad_(), r(B, T, H, V).requires_grad_(), \
        (-torch.rand(B, T, H, K)).requires_grad_()
    torch.library.opcheck(torch.ops.ladle.recurrent.default, (key, q, k, v, [g], "g", [K ** -0.5], "scale", None, None, False,
                                                               True, "auto", "auto"))


def test_update_backward_chooses_the_form_and_refuses_unknown_ones():
    # The update forms' backward form (the GPU's chunked WY form or the fp32 recurrence) is a choice
    # of the backward only: every choice gives the same gradients on the CPU path, through run_variant
    # and the fla-named ops, and an unknown one is refused by name before any work.
    r, (B, T, H, K, V) = shapes("cpu", torch.float32, T=20, seed=5)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    beta = torch.rand(B, T, H)
    grads = {}
    for form in ("auto", "recurrent", "chunked"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, beta)]
        o, _ = lt.chunk_delta_rule(*leaves, use_qk_l2norm_in_kernel=True, update_backward=form)
        o.sum().backward()
        grads[form] = [x.grad for x in leaves]
    for form in ("recurrent", "chunked"):
        for got, want in zip(grads[form], grads["auto"]):
            assert torch.allclose(got, want)
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads["auto"])
    with pytest.raises(ValueError, match="update_backward"):
        lt.run_variant(ladle.named_variant("delta_rule"), q, k, v, {"beta": beta}, update_backward="fast")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fla_names_trace_without_a_graph_break(backend):
    r, (B, T, H, K, V) = shapes("cpu", torch.float32, T=24, seed=12)
    x = dsl.token_key("x")
    gate = dsl.lower(dsl.read(dsl.scan(dsl.k, dsl.v).decay_k(dsl.logsigmoid(x) / 8), dsl.q, dsl.scalar("scale")), "g8")

    def f(q, k, v, g, beta):
        a, _ = lt.chunk_gla(q, k, v, g)
        b, s = lt.chunk_gated_delta_rule(q, k, v, g.mean(-1), beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
        c, _ = lt.run_variant(gate, q, k, v, {"x": g})
        return a + b + c, s

    args = [r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), -torch.rand(B, T, H, K), torch.rand(B, T, H)]
    eager = f(*args)
    compiled = torch.compile(f, backend=backend, fullgraph=True)(*args)
    assert torch.allclose(eager[0], compiled[0]) and torch.allclose(eager[1], compiled[1])
    leaves = [leaf(a) for a in args]
    o, _ = torch.compile(f, backend=backend, fullgraph=True)(*leaves)
    o.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


def test_torch_errors_name_the_argument():
    r, (B, T, H, K, V) = shapes("cpu", torch.float32, T=8, seed=4)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    with pytest.raises(ValueError, match="state_v_first"):
        lt.chunk_gla(q, k, v, -torch.rand(B, T, H, K), state_v_first=True)
    with pytest.raises(ValueError, match="unexpected keyword argument 'head_first'"):
        lt.chunk_gla(q, k, v, -torch.rand(B, T, H, K), head_first=True)
    with pytest.raises(ValueError, match=r"g has shape \[2,8,2,31\]"):
        lt.chunk_gla(q, k, v, -torch.rand(B, T, H, K - 1))
    with pytest.raises(ValueError, match="A_log"):
        lt.chunk_kda(q, k, v, r(B, T, H, K), torch.rand(B, T, H), use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="inputs\\['y'\\]"):
        lt.run_variant(ladle.named_variant("gla"), q, k, v, {"g": q, "y": q})
    with pytest.raises(TypeError, match="q: expected a torch.Tensor"):
        lt.run_variant(ladle.named_variant("gla"), [1.0], k, v, {"g": q})


def attention_oracle(q, k, v, scale, causal=False, window=None, softcap=None, sinks=None):
    """Softmax attention in fp64, [B,T,H,D], GQA by repetition; sinks [H] add one logit each."""
    q, k, v = q.double(), k.double(), v.double()
    H, Hkv = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(H // Hkv, 2), v.repeat_interleave(H // Hkv, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    Tq, Tk = q.shape[1], k.shape[1]
    i = torch.arange(Tq)[:, None] + (Tk - Tq)
    j = torch.arange(Tk)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sink = sinks.double().view(1, H, 1, 1).expand(s.shape[0], H, Tq, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return torch.einsum("bhij,bjhd->bihd", p, v)


def test_attention_with_masks_sinks_and_gqa_on_the_cpu():
    r, _ = shapes("cpu", torch.float32, seed=13)
    B, T, H, Hkv, D = 2, 40, 4, 2, 16
    q, k, v, sinks = r(B, T, H, D), r(B, T, Hkv, D), r(B, T, Hkv, D), r(H)
    for kw in (dict(causal=True), dict(causal=True, window=(8, 0), softcap=5.0), dict(window=(5, 3), sinks=True)):
        use_sinks = kw.pop("sinks", False)
        ours = [leaf(x) for x in (q, k, v, sinks)]
        theirs = [leaf(x.double()) for x in (q, k, v, sinks)]
        o = lt.attention(*ours[:3], sinks=ours[3] if use_sinks else None, **kw)
        ro = attention_oracle(*theirs[:3], D ** -0.5, sinks=theirs[3] if use_sinks else None, **kw)
        assert rel(o, ro) < 1e-5, kw
        do = torch.randn_like(ro)
        n = 4 if use_sinks else 3
        g_ours = torch.autograd.grad(o, ours[:n], do.float())
        g_ref = torch.autograd.grad(ro, theirs[:n], do)
        for name, a, b in zip(["q", "k", "v", "sinks"], g_ours, g_ref):
            assert a.dtype == torch.float32 and rel(a, b) < 1e-4, (kw, name, rel(a, b))
    # The custom op torch.compile sees: traced whole, its backward (the forward again, then ladle's) equal to eager.
    f = lambda q_, k_, v_, s_: lt.attention(q_, k_, v_, causal=True, window=(8, 0), softcap=5.0, sinks=s_)  # noqa: E731
    ours = [leaf(x) for x in (q, k, v, sinks)]
    eager = f(*ours)
    g_eager = torch.autograd.grad(eager, ours, torch.ones_like(eager))
    compiled = [leaf(x) for x in (q, k, v, sinks)]
    traced = torch.compile(f, backend="aot_eager", fullgraph=True)(*compiled)
    assert torch.allclose(traced, eager, atol=1e-6)
    for a, b in zip(torch.autograd.grad(traced, compiled, torch.ones_like(traced)), g_eager):
        assert torch.allclose(a, b, atol=1e-5)
    key = torch.ops.ladle.attention.default
    torch.library.opcheck(key, (leaf(q), leaf(k), leaf(v), None, leaf(sinks.view(-1, 1)), None, None, None, None, None, None, 5.0,
                                True, True, 8, 0, 0.0, 0, True))
    o, lse = lt.attention(q, k, v, causal=True, return_lse=True)
    assert lse.shape[-1] == T or lse.numel() == B * H * T
    with pytest.raises(ValueError, match="window"):
        lt.attention(q, k, v, window=(1, 2, 3))


def test_attention_backward_after_an_in_place_change_is_refused_by_autograd():
    # ladle keeps no fingerprint of the tensors a backward reads again (check_saved is off from Python):
    # autograd's version counters refuse the backward instead, and an untouched call still trains.
    r, _ = shapes("cpu", torch.float32, seed=17)
    q, k, v = (leaf(r(1, 12, 2, 8)) for _ in range(3))
    o = lt.attention(q, k, v, causal=True)
    with torch.no_grad():
        k.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        o.sum().backward()
    o = lt.attention(q, k, v, causal=True)
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_a_dsl_attention_variant_with_its_gradients_on_the_cpu():
    # ALiBi with a learned slope per head, a soft cap and a banded mask, written in the DSL.
    slope = dsl.head_param("slope")
    logit = dsl.soft_cap(dsl.score * dsl.scalar("scale") + slope * (dsl.key_index - dsl.query_index), 10.0)
    band = (dsl.query_index - dsl.key_index < 6) & (dsl.key_index <= dsl.query_index)
    variant = dsl.lower(dsl.softmax(logit).mask(band), "alibi_band")
    assert "slope" in variant.kinds and variant.kinds["slope"] == "head" and len(variant.hash) == 16
    r, _ = shapes("cpu", torch.float32, seed=15)
    B, T, H, D = 2, 30, 3, 8
    q, k, v, slopes = r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), -torch.rand(H)
    ours = [leaf(x) for x in (q, k, v, slopes)]
    theirs = [leaf(x.double()) for x in (q, k, v, slopes)]
    o = lt.run_attention(variant, *ours[:3], {"slope": ours[3]})

    def ref(q_, k_, v_, slope_):
        s_ = torch.einsum("bihd,bjhd->bhij", q_, k_) * D ** -0.5
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        s_ = s_ + slope_.view(1, H, 1, 1) * (j - i)
        s_ = 10.0 * torch.tanh(s_ / 10.0)
        s_ = s_.masked_fill(~((i - j < 6) & (j <= i)), float("-inf"))
        return torch.einsum("bhij,bjhd->bihd", torch.softmax(s_, -1), v_)

    ro = ref(*theirs)
    assert rel(o, ro) < 1e-5
    do = torch.randn_like(ro)
    for name, a, b in zip(["q", "k", "v", "slope"], torch.autograd.grad(o, ours, do.float()), torch.autograd.grad(ro, theirs, do)):
        assert rel(a, b) < 1e-4, (name, rel(a, b))
    # Under torch.compile: the custom op ladle::run_attention, traced whole, gradients equal to eager's.
    compiled = [leaf(x) for x in (q, k, v, slopes)]
    f = lambda q_, k_, v_, s_: lt.run_attention(variant, q_, k_, v_, {"slope": s_})  # noqa: E731
    traced = torch.compile(f, backend="aot_eager", fullgraph=True)(*compiled)
    assert torch.allclose(traced, o, atol=1e-6)
    for a, b in zip(torch.autograd.grad(traced, compiled, do.float()), torch.autograd.grad(f(*ours), ours, do.float())):
        assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="softmax\\(logit\\)"):
        dsl.softmax(dsl.q)
    with pytest.raises(ValueError, match="inputs\\['tau'\\]"):
        lt.run_attention(variant, q, k, v, {"tau": slopes})


# --- the GPU (bf16) --------------------------------------------------------------------------------


@gpu
@pytest.mark.gpu
def test_ops_on_the_gpu_against_fp64():
    dev = "cuda"
    r, (B, T, H, K, V) = shapes(dev, torch.bfloat16, B=2, T=200, H=4, K=64, V=64, seed=5)
    q, k, v, h0 = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), r(B, H, K, V).float()
    kn = torch.nn.functional.normalize(k.float(), dim=-1).bfloat16()
    gk = (torch.nn.functional.logsigmoid(r(B, T, H, K).float()) / 16)
    gh = -torch.rand(B, T, H, device=dev) * 0.2
    beta = torch.rand(B, T, H, device=dev).bfloat16()
    # Forward and backward: the diagonal forms.
    check(lambda q, k, v, g, h0: lt.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True),
          lambda q, k, v, g, h0: oracle(q, k, v, K ** -0.5, gk=g, h0=h0), (q, k, v, gk.bfloat16(), h0), 1e-2, 2e-2,
          ["q", "k", "v", "g", "initial_state"])
    check(lambda q, k, v, g: lt.chunk_simple_gla(q, k, v, g=g, output_final_state=True),
          lambda q, k, v, g: oracle(q, k, v, K ** -0.5, gh=g), (q, k, v, gh), 1e-2, 2e-2, ["q", "k", "v", "g"])
    check(lambda q, k, v, g: lt.fused_recurrent_gla(q, k, v, gk=g, output_final_state=True),
          lambda q, k, v, g: oracle(q, k, v, K ** -0.5, gk=g), (q, k, v, gk.bfloat16()), 1e-2, 2e-2, ["q", "k", "v", "gk"])
    # The update forms: forward on the tensor cores, backward in fp32 (ladle_bwd_update).
    check(lambda q, k, v, b: lt.chunk_delta_rule(q, k, v, b, output_final_state=True),
          lambda q, k, v, b: oracle(q, k, v, K ** -0.5, beta=b), (q, kn, v, beta), 1e-2, 2e-2, ["q", "k", "v", "beta"])
    check(lambda q, k, v, g, b: lt.chunk_gated_delta_rule(q, k, v, g, b, use_qk_l2norm_in_kernel=True, output_final_state=True),
          lambda q, k, v, g, b: oracle(q, k, v, K ** -0.5, gh=g, beta=b, l2=True), (q, k, v, gh, beta), 1e-2, 2e-2,
          ["q", "k", "v", "g", "beta"])
    check(lambda q, k, v, w, u: lt.chunk_rwkv6(q, k, v, w, u, output_final_state=True),
          lambda q, k, v, w, u: oracle(q, k, v, K ** -0.5, gk=w, u=u), (q, k, v, gk.bfloat16(), r(H, K).float()), 1e-2, 2e-2,
          ["q", "k", "v", "w", "u"])
    check(lambda q, k, v, g, b: lt.chunk_kda(q, k, v, g, b, use_qk_l2norm_in_kernel=True, output_final_state=True),
          lambda q, k, v, g, b: oracle(q, k, v, K ** -0.5, gk=g, beta=b, l2=True), (q, k, v, gk.bfloat16(), beta), 1e-2, 2e-2,
          ["q", "k", "v", "g", "beta"])


@gpu
@pytest.mark.gpu
def test_packed_sequences_and_grouped_value_heads_on_the_gpu():
    dev = "cuda"
    r, (B, T, H, K, V) = shapes(dev, torch.bfloat16, B=1, T=300, H=2, K=64, V=64, seed=6)
    lengths = [100, 0, 135, 65]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    q, k, v = r(1, T, H, K), r(1, T, H, K), r(1, T, 2 * H, V)  # grouped value heads: HV = 2 H
    g = (torch.nn.functional.logsigmoid(r(1, T, 2 * H, K).float()) / 16).bfloat16()
    o, s = lt.chunk_gla(q, k, v, g, cu_seqlens=cu, output_final_state=True)
    assert o.shape == (1, T, 2 * H, V) and s.shape == (4, 2 * H, K, V)
    qr, kr = q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        if a == b:
            assert s[n].abs().max().item() == 0
            continue
        ro, rs = oracle(qr[:, a:b].cpu(), kr[:, a:b].cpu(), v[:, a:b].cpu(), K ** -0.5, gk=g[:, a:b].cpu())
        assert rel(o[:, a:b].cpu(), ro) < 1e-2 and rel(s[n:n + 1].cpu(), rs) < 1e-2


@gpu
@pytest.mark.gpu
def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(7)

    class Layer(torch.nn.Module):
        def __init__(self, d=128, heads=2, k=64):
            super().__init__()
            self.heads, self.k = heads, k
            self.qkvg = torch.nn.Linear(d, 4 * heads * k, bias=False)
            self.out = torch.nn.Linear(heads * k, d, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v, g = self.qkvg(x).view(B, T, 4, self.heads, self.k).unbind(2)
            o, _ = lt.chunk_gla(q.contiguous(), k.contiguous(), v.contiguous(),
                                (torch.nn.functional.logsigmoid(g) / 16).contiguous())
            return self.out(o.reshape(B, T, -1))

    layer = Layer().cuda().bfloat16()
    x = torch.randn(2, 256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = layer(x)
    eager.float().square().mean().backward()
    g_eager = x.grad.clone()
    x.grad = None
    compiled = torch.compile(layer, fullgraph=True)
    out = compiled(x)
    out.float().square().mean().backward()
    assert rel(out.float(), eager.float()) < 1e-2
    assert rel(x.grad.float(), g_eager.float()) < 2e-2


@gpu
@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    r, (B, T, H, K, V) = shapes("cuda", torch.bfloat16, B=2, T=256, H=4, K=64, V=64, seed=8)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    g = (torch.nn.functional.logsigmoid(r(B, T, H, K).float()) / 16).bfloat16()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        lt.chunk_gla(q, k, v, g)  # compiles and plans outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, _ = lt.chunk_gla(q, k, v, g)
    for seed in (9, 10):
        r2, _ = shapes("cuda", torch.bfloat16, B=B, T=T, H=H, K=K, V=V, seed=seed)
        q.copy_(r2(B, T, H, K)), k.copy_(r2(B, T, H, K)), v.copy_(r2(B, T, H, V))
        graph.replay()
        torch.cuda.synchronize()
        expected, _ = lt.chunk_gla(q, k, v, g)
        assert torch.equal(o, expected)
        ro, _ = oracle(q.cpu(), k.cpu(), v.cpu(), K ** -0.5, gk=g.cpu())
        assert rel(o.cpu(), ro) < 1e-2


@gpu
@pytest.mark.gpu
def test_attention_on_the_gpu_against_fp64():
    r, _ = shapes("cuda", torch.bfloat16, seed=14)
    B, T, H, Hkv, D = 2, 300, 4, 2, 64
    q, k, v, sinks = r(B, T, H, D), r(B, T, Hkv, D), r(B, T, Hkv, D), r(H).float()
    for kw in (dict(causal=True), dict(causal=True, window=(64, 0), softcap=20.0, sinks=True)):
        use_sinks = kw.pop("sinks", False)
        ours = [leaf(x) for x in (q, k, v, sinks)]
        theirs = [leaf(x.detach().cpu().double()) for x in (q, k, v, sinks)]
        o = lt.attention(*ours[:3], sinks=ours[3] if use_sinks else None, **kw)
        ro = attention_oracle(*theirs[:3], D ** -0.5, sinks=theirs[3] if use_sinks else None, **kw)
        assert o.is_cuda and o.dtype == torch.bfloat16 and rel(o.cpu(), ro) < 1e-2, kw
        do = torch.randn_like(ro)
        n = 4 if use_sinks else 3
        g_ours = torch.autograd.grad(o, ours[:n], do.to("cuda", torch.bfloat16))
        g_ref = torch.autograd.grad(ro, theirs[:n], do)
        for name, a, b in zip(["q", "k", "v", "sinks"], g_ours, g_ref):
            assert a.dtype == ours[["q", "k", "v", "sinks"].index(name)].dtype and rel(a.cpu(), b) < 2e-2, (kw, name, rel(a.cpu(), b))


@gpu
@pytest.mark.gpu
def test_a_gla_layer_trains():
    torch.manual_seed(11)
    d, heads, kd = 64, 2, 32
    proj = torch.nn.Linear(d, 4 * heads * kd).cuda()
    head = torch.nn.Linear(heads * kd, d).cuda()
    opt = torch.optim.Adam([*proj.parameters(), *head.parameters()], lr=3e-3)
    x = torch.randn(4, 128, d, device="cuda")
    target = torch.roll(x, 1, dims=1)  # the previous token: a recurrence can learn it
    losses = []
    for _ in range(60):
        q, k, v, g = proj(x).view(4, 128, 4, heads, kd).unbind(2)
        o, _ = lt.chunk_gla(q.bfloat16().contiguous(), k.bfloat16().contiguous(), v.bfloat16().contiguous(),
                            (torch.nn.functional.logsigmoid(g) / 8).bfloat16().contiguous())
        loss = torch.nn.functional.mse_loss(head(o.float().reshape(4, 128, -1)), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v_) for v_ in losses)
    assert losses[-1] < 0.7 * losses[0], losses[::10]
