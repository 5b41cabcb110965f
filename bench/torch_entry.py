"""ladle.torch beside fla in one process on the GPU (issue 40), printing one JSON object per line:
  - the cost of one call from Python at a tiny shape whose kernel is cached (host and wall time per
    call over 300 calls queued back to back, one synchronisation at the end), ladle and fla;
  - fla's names at the benchmark shapes, forward and forward + backward, ladle and fla interleaved
    (triton.testing.do_bench medians, CUDA events);
  - GLA's gradients against an fp64 oracle, ladle's error beside fla's on the same inputs.
Run by bench/python-check.sh (fla's wheels on PYTHONPATH)."""
import argparse
import json
import sys
import time

import torch
import triton

import ladle
import ladle.torch as lt
from torch_overhead import per_call_us  # bench/, beside this script

try:
    from fla.ops.delta_rule import chunk_delta_rule as fla_chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk_gated_delta_rule
    from fla.ops.gla import chunk_gla as fla_chunk_gla
    from fla.ops.kda import chunk_kda as fla_chunk_kda
    from fla.ops.rwkv6 import chunk_rwkv6 as fla_chunk_rwkv6
    from fla.ops.simple_gla import chunk_simple_gla as fla_chunk_simple_gla
    HAVE_FLA = True
except Exception as e:  # noqa: BLE001
    print(json.dumps({"note": f"fla not importable: {e}"}))
    HAVE_FLA = False


def emit(**kw):
    print(json.dumps(kw), flush=True)


def bench(fn):
    # A cold ladle call runs the fused recurrent kernel while its chunked kernels compile behind it:
    # one call, then wait for those compiles, so that the timing is of the kernels a steady call runs.
    fn()
    ladle.finish_background_compiles()
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def inputs(B, T, H, K, V, seed=0, grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    bf = torch.bfloat16
    x = {
        "q": r(B, T, H, K).to(bf), "k": torch.nn.functional.normalize(r(B, T, H, K), dim=-1).to(bf), "v": r(B, T, H, V).to(bf),
        "gk": (torch.nn.functional.logsigmoid(r(B, T, H, K)) / 16).to(bf),
        "gh": -torch.rand(B, T, H, device="cuda", generator=g) * 0.1,
        "beta": torch.rand(B, T, H, device="cuda", generator=g).to(bf),
        "u": r(H, K).to(bf),
    }
    if grad:
        for name in ("q", "k", "v", "gk", "gh", "beta", "u"):
            x[name].requires_grad_(True)
    return x


# The inputs each op's forward + backward differentiates.
LEAVES = {"chunk_gla": ("q", "k", "v", "gk"), "chunk_simple_gla": ("q", "k", "v", "gh"), "chunk_delta_rule": ("q", "k", "v", "beta"),
          "chunk_gated_delta_rule": ("q", "k", "v", "gh", "beta"), "chunk_rwkv6": ("q", "k", "v", "gk", "u"),
          "chunk_kda": ("q", "k", "v", "gk", "beta")}


def ops(x):
    """name -> (ladle call, fla call, has a GPU backward in ladle)."""
    q, k, v, gk, gh, beta, u = (x[n] for n in ("q", "k", "v", "gk", "gh", "beta", "u"))
    table = {
        "chunk_gla": (lambda: lt.chunk_gla(q, k, v, gk)[0], lambda: fla_chunk_gla(q, k, v, gk)[0], True),
        "chunk_simple_gla": (lambda: lt.chunk_simple_gla(q, k, v, g=gh)[0], lambda: fla_chunk_simple_gla(q, k, v, g=gh)[0], True),
        "chunk_delta_rule": (lambda: lt.chunk_delta_rule(q, k, v, beta)[0], lambda: fla_chunk_delta_rule(q, k, v, beta)[0], True),
        "chunk_gated_delta_rule": (lambda: lt.chunk_gated_delta_rule(q, k, v, gh, beta)[0],
                                   lambda: fla_chunk_gated_delta_rule(q, k, v, gh, beta)[0], True),
        "chunk_rwkv6": (lambda: lt.chunk_rwkv6(q, k, v, gk, u)[0], lambda: fla_chunk_rwkv6(q, k, v, gk, u)[0], True),
        "chunk_kda": (lambda: lt.chunk_kda(q, k, v, gk, beta)[0], lambda: fla_chunk_kda(q, k, v, gk, beta)[0], True),
    }
    return table


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8x4096x16x128x128,2x16384x16x128x128")
    # chunk_simple_gla last: its row stalled a run for minutes (fla's first call, or ladle's; not yet known).
    p.add_argument("--ops", default="chunk_gla,chunk_gated_delta_rule,chunk_kda,chunk_delta_rule,chunk_rwkv6,chunk_simple_gla")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: overhead,speed,grad")
    p.add_argument("--grad-ops", default="chunk_gla,chunk_delta_rule,chunk_gated_delta_rule,chunk_rwkv6,chunk_kda")
    p.add_argument("--grad-fla", default="all", help="ops whose gradients fla computes too (all, none, or a list): its first "
                   "backward of each op compiles for minutes")
    args = p.parse_args()
    skip = set(args.skip.split(","))

    if "overhead" not in skip:
        x = inputs(1, 64, 1, 64, 64)
        table = ops(x)
        for name in ("chunk_gla", "chunk_gated_delta_rule"):
            ours, theirs, _ = table[name]
            row = {"part": "overhead", "op": name, "shape": "B1 T64 H1 K64 V64 bf16", "ladle_host_wall_us": per_call_us(ours, 300)}
            if HAVE_FLA:
                row["fla_host_wall_us"] = per_call_us(theirs, 300)
                row["ladle_host_wall_us_again"] = per_call_us(ours, 300)
            emit(**row)

    if "speed" not in skip:
        for shape in args.shapes.split(","):
            B, T, H, K, V = (int(s) for s in shape.split("x"))
            label = f"B{B} T{T} H{H} K{K} V{V} bf16"
            for name in args.ops.split(","):
                print(f"{time.strftime('%H:%M:%S')} {name} {label}", file=sys.stderr, flush=True)  # progress, for a stalled run
                x = inputs(B, T, H, K, V, grad=True)
                ours, theirs, has_backward = ops(x)[name]
                row = {"part": "speed", "op": name, "shape": label}

                def timed(key, fn):
                    # A refusal (fla's gated backward on Hopper with this Triton: its #640) is recorded, not fatal.
                    try:
                        row[key] = bench(fn)
                    except Exception as e:  # noqa: BLE001
                        row[key + "_error"] = f"{type(e).__name__}: {str(e)[:160]}"

                timed("ladle_fwd_ms", ours)
                if HAVE_FLA:
                    timed("fla_fwd_ms", theirs)
                    timed("ladle_fwd_ms_again", ours)
                leaves = [x[n] for n in LEAVES[name]]
                do = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)

                def fwd_bwd(f):
                    return lambda: torch.autograd.grad(f(), leaves, do, allow_unused=True)

                if has_backward:
                    timed("ladle_fwd_bwd_ms", fwd_bwd(ours))
                if HAVE_FLA:
                    timed("fla_fwd_bwd_ms", fwd_bwd(theirs))
                    if has_backward:
                        timed("ladle_fwd_bwd_ms_again", fwd_bwd(ours))
                emit(**row)
                del x
                torch.cuda.empty_cache()

    if "grad" not in skip:
        # Each op's gradients at T 1000 against fp64 (issue 36's distribution), ladle beside fla on the same inputs.
        B, T, H, K, V = 1, 1000, 2, 128, 128
        x = inputs(B, T, H, K, V, seed=3)
        do = torch.randn(B, T, H, V, device="cuda")

        def oracle(q, k, v, gk=None, gh=None, beta=None, u=None):
            S = torch.zeros(B, H, K, V, dtype=q.dtype, device=q.device)
            outs = []
            for t in range(T):
                kt, vt, qt = k[:, t], v[:, t], q[:, t]
                if u is not None:  # RWKV6: the read before the update (and its decay), with the bonus
                    outs.append(K ** -0.5 * (torch.einsum("bhk,bhkv->bhv", qt, S) + (u[None] * kt * qt).sum(-1, keepdim=True) * vt))
                    S = S * gk[:, t].exp()[..., None] + kt[..., None] * vt[..., None, :]
                    continue
                if gk is not None:
                    S = S * gk[:, t].exp()[..., None]
                if gh is not None:
                    S = S * gh[:, t].exp()[..., None, None]
                if beta is not None:
                    bt = beta[:, t][..., None]
                    S = S + (bt * kt)[..., None] * (vt - torch.einsum("bhk,bhkv->bhv", kt, S))[..., None, :]
                else:
                    S = S + kt[..., None] * vt[..., None, :]
                outs.append(K ** -0.5 * torch.einsum("bhk,bhkv->bhv", qt, S))
            return torch.stack(outs, 1)

        cases = {
            "chunk_gla": (lambda q, k, v, g: oracle(q, k, v, gk=g), lambda q, k, v, g: lt.chunk_gla(q, k, v, g)[0],
                          lambda q, k, v, g: fla_chunk_gla(q, k, v, g)[0]),
            "chunk_delta_rule": (lambda q, k, v, b: oracle(q, k, v, beta=b), lambda q, k, v, b: lt.chunk_delta_rule(q, k, v, b)[0],
                                 lambda q, k, v, b: fla_chunk_delta_rule(q, k, v, b)[0]),
            "chunk_gated_delta_rule": (lambda q, k, v, g, b: oracle(q, k, v, gh=g, beta=b),
                                       lambda q, k, v, g, b: lt.chunk_gated_delta_rule(q, k, v, g, b)[0],
                                       lambda q, k, v, g, b: fla_chunk_gated_delta_rule(q, k, v, g, b)[0]),
            "chunk_rwkv6": (lambda q, k, v, w, u: oracle(q, k, v, gk=w, u=u), lambda q, k, v, w, u: lt.chunk_rwkv6(q, k, v, w, u)[0],
                            lambda q, k, v, w, u: fla_chunk_rwkv6(q, k, v, w, u)[0]),
            "chunk_kda": (lambda q, k, v, g, b: oracle(q, k, v, gk=g, beta=b), lambda q, k, v, g, b: lt.chunk_kda(q, k, v, g, b)[0],
                          lambda q, k, v, g, b: fla_chunk_kda(q, k, v, g, b)[0]),
        }
        for name, (ref_fn, ours, theirs) in cases.items():
            if name not in args.grad_ops.split(","):
                continue
            base = [x[n].detach() for n in LEAVES[name]]

            def grads(f, dtype):
                leaves = [t.to(dtype if t.dtype == torch.bfloat16 or dtype == torch.float64 else t.dtype).requires_grad_(True)
                          for t in base]
                return torch.autograd.grad(f(*leaves), leaves, do.to(dtype))

            ref = grads(ref_fn, torch.float64)
            rows = {"ladle": ours}
            if HAVE_FLA and (args.grad_fla == "all" or name in args.grad_fla.split(",")):
                rows["fla"] = theirs
            for impl, f in rows.items():
                try:
                    got = grads(f, torch.bfloat16)
                except Exception as e:  # noqa: BLE001  (fla's gated backward on Hopper with this Triton: its #640)
                    emit(part="grad", op=name, impl=impl, error=f"{type(e).__name__}: {str(e)[:160]}")
                    continue
                emit(part="grad", op=name, impl=impl, shape=f"B{B} T{T} H{H} K{K} V{V} bf16",
                     **{f"d{n}": ((a.double() - b).norm() / b.norm()).item() for n, a, b in zip(LEAVES[name], got, ref)})


if __name__ == "__main__":
    main()
