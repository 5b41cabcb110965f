"""Context parallelism from Python (ladle.run_variant(..., group=...)): ranks as threads of this
process (ladle.ThreadGroup), each passing its slice of the tokens; the slices put back together equal
the whole call, forward and backward, and a bad argument on one rank is an error on every rank."""
import threading

import numpy as np
import pytest

import ladle


def _gla_inputs(rng, B=2, T=48, H=2, K=16, V=8):
    q = rng.standard_normal((B, T, H, K)).astype(np.float32) * 0.5
    k = rng.standard_normal((B, T, H, K)).astype(np.float32) * 0.5
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    g = (-np.log1p(np.exp(-rng.standard_normal((B, T, H, K)))) / 16).astype(np.float32)
    h0 = rng.standard_normal((B, H, K, V)).astype(np.float32) * 0.5
    return q, k, v, g, h0


def _on_ranks(P, work):
    results, errors = [None] * P, [None] * P

    def run(r):
        try:
            results[r] = work(r)
        except Exception as e:  # noqa: BLE001 (every rank's error is checked)
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def test_slices_equal_the_whole_call_forward_and_backward():
    rng = np.random.default_rng(7)
    q, k, v, g, h0 = _gla_inputs(rng)
    variant = ladle.named_variant("gla")
    whole, whole_final = ladle.run_variant(variant, q, k, v, {"g": g}, initial_state=h0, output_final_state=True, backend="cpu")
    d_o = rng.standard_normal(whole.shape).astype(np.float32)
    whole_grads = ladle.run_variant_backward(variant, q, k, v, {"g": g}, d_o, initial_state=h0, backend="cpu")
    cuts = [0, 13, 30, 48]
    group = ladle.ThreadGroup(3)
    assert group.rank(1).rank == 1 and group.rank(1).size == 3

    def work(r):
        part = slice(cuts[r], cuts[r + 1])
        args = [x[:, part].copy() for x in (q, k, v)]
        g_r, d_o_r = g[:, part].copy(), d_o[:, part].copy()
        o, final = ladle.run_variant(variant, *args, {"g": g_r}, initial_state=h0, output_final_state=True, backend="cpu",
                                     group=group.rank(r))
        grads = ladle.run_variant_backward(variant, *args, {"g": g_r}, d_o_r, initial_state=h0, backend="cpu", group=group.rank(r))
        return o, final, grads

    results, errors = _on_ranks(3, work)
    assert errors == [None, None, None]
    np.testing.assert_allclose(np.concatenate([r[0] for r in results], axis=1), whole, rtol=1e-5, atol=1e-5)
    for _, final, grads in results:
        np.testing.assert_allclose(final, whole_final, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(grads["initial_state"], whole_grads["initial_state"], rtol=1e-4, atol=1e-5)
    for name in ("q", "k", "v", "g"):
        joined = np.concatenate([r[2][name] for r in results], axis=1)
        np.testing.assert_allclose(joined, whole_grads[name], rtol=1e-4, atol=1e-5)


def test_a_bad_slice_is_refused_on_every_rank():
    rng = np.random.default_rng(9)
    q, k, v, g, _ = _gla_inputs(rng)
    variant = ladle.named_variant("gla")
    group = ladle.ThreadGroup(2)

    def work(r):
        part = slice(0, 24) if r == 0 else slice(24, 48)
        g_r = g[:, part, :, :15].copy() if r == 1 else g[:, part].copy()
        return ladle.run_variant(variant, q[:, part].copy(), k[:, part].copy(), v[:, part].copy(), {"g": g_r}, backend="cpu",
                                 group=group.rank(r))

    _, errors = _on_ranks(2, work)
    assert all(isinstance(e, ValueError) for e in errors)
    assert "g has shape" in str(errors[1])
    assert "rank 1 of 2 refused its arguments" in str(errors[0])


def test_a_rank_outside_the_group():
    with pytest.raises(ValueError, match="expected 0 to 1"):
        ladle.ThreadGroup(2).rank(2)


def test_torch_autograd_over_a_group_of_threads():
    torch = pytest.importorskip("torch")
    import ladle.torch as lt

    gen = torch.Generator().manual_seed(3)
    B, T, H, K, V = 1, 40, 2, 16, 8
    q, k = torch.randn(B, T, H, K, generator=gen) * 0.5, torch.randn(B, T, H, K, generator=gen) * 0.5
    v = torch.randn(B, T, H, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / 16
    h0 = torch.randn(B, H, K, V, generator=gen) * 0.5
    weight = torch.randn(B, T, H, V, generator=gen)
    variant = ladle.named_variant("gla")

    def leaves(*xs):
        return [x.clone().requires_grad_(True) for x in xs]

    wq, wk, wv, wg, wh0 = leaves(q, k, v, g, h0)
    o, _ = lt.run_variant(variant, wq, wk, wv, {"g": wg}, initial_state=wh0)
    (o * weight).sum().backward()
    cuts = [0, 17, T]
    group = ladle.ThreadGroup(2)

    def work(r):
        part = slice(cuts[r], cuts[r + 1])
        rq, rk, rv, rg = leaves(q[:, part], k[:, part], v[:, part], g[:, part])
        rh0 = h0.clone().requires_grad_(True)
        ro, _ = lt.run_variant(variant, rq, rk, rv, {"g": rg}, initial_state=rh0, group=group.rank(r))
        (ro * weight[:, part]).sum().backward()
        return ro.detach(), rq.grad, rk.grad, rv.grad, rg.grad, rh0.grad

    results, errors = _on_ranks(2, work)
    assert errors == [None, None]
    torch.testing.assert_close(torch.cat([r[0] for r in results], 1), o.detach(), rtol=1e-5, atol=1e-5)
    for i, whole in enumerate((wq.grad, wk.grad, wv.grad, wg.grad), start=1):
        torch.testing.assert_close(torch.cat([r[i] for r in results], 1), whole, rtol=1e-4, atol=1e-5)
    for r in results:
        torch.testing.assert_close(r[5], wh0.grad, rtol=1e-4, atol=1e-5)
