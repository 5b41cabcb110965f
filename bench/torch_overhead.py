"""Where a cached ladle.torch call's host time goes (issue 40: under 30 us a call), at a tiny shape
whose kernel time is small: host and wall time per call over --n calls (one synchronisation at the end) of
  torch_noop          a do-nothing torch custom op (the dispatcher's own cost),
  native_run          ladle._ladle.run on prepared outputs (DLPack capsules made per call),
  chunk_gla           ladle.torch.chunk_gla, no gradient needed (the forward called at once),
  fused_recurrent_gla the same through the fused-recurrent kernel,
  chunk_gla_autograd  chunk_gla with q requiring grad (the custom op and its autograd node),
each printed as JSON. LADLE_AUTOTUNE=heuristic unless set. Run under nsys to count driver calls.
--profile CASE: where the case's Python time goes instead (cProfile over --n calls, the 25 costliest
functions by their own time)."""
import argparse
import json
import os
import time

os.environ.setdefault("LADLE_AUTOTUNE", "heuristic")

import torch  # noqa: E402
import torch.utils.dlpack as dl  # noqa: E402

import ladle.torch as lt  # noqa: E402
from ladle import _ladle  # noqa: E402


@torch.library.custom_op("ladle_bench::noop", mutates_args=())
def noop(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def per_call_us(fn, n):
    """(host, wall) microseconds a call: the time to return from n calls queued back to back (n stays
    under the driver's queue depth, so the host does not wait for the GPU), and the time until the GPU
    has finished them."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    import ladle  # a cold ladle call's kernels may still compile behind it: time the steady ones
    ladle.finish_background_compiles()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter()
    torch.cuda.synchronize()
    wall = time.perf_counter()
    return (host - t) / n * 1e6, (wall - t) / n * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--only", default="")
    p.add_argument("--profile", default="")
    p.add_argument("--with-fla", action="store_true", help="import fla (on PYTHONPATH) first, and time its chunk_gla too")
    a = p.parse_args()
    fla_chunk_gla = None
    if a.with_fla:
        from fla.ops.gla import chunk_gla as fla_chunk_gla
    B, T, H, K, V = 1, 64, 1, 64, 64
    q, k = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
    g = -torch.rand(B, T, H, K, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(v)
    stream = torch.cuda.current_stream().cuda_stream
    native = lt._GLA.native
    cases = {
        "torch_noop": lambda: noop(q),
        "native_run": lambda: _ladle.run(native, dl.to_dlpack(q), dl.to_dlpack(k), dl.to_dlpack(v), {"g": dl.to_dlpack(g)},
                                         {"scale": 0.125}, dl.to_dlpack(o), None, None, None, False, "gpu", "chunked", stream,
                                         True, False),
        "chunk_gla": lambda: lt.chunk_gla(q, k, v, g),
        "fused_recurrent_gla": lambda: lt.fused_recurrent_gla(q, k, v, gk=g),
        "chunk_gla_autograd": lambda: lt.chunk_gla(qg, k, v, g),
    }
    if fla_chunk_gla is not None:
        cases["fla_chunk_gla"] = lambda: fla_chunk_gla(q, k, v, g)
        cases["chunk_gla_again"] = cases["chunk_gla"]
    qg = q.clone().requires_grad_(True)
    if a.profile:
        import cProfile
        import pstats
        fn = cases[a.profile]
        per_call_us(fn, a.n)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(a.n):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    for name, fn in cases.items():
        if a.only and name != a.only:
            continue
        host, wall = per_call_us(fn, a.n)
        print(json.dumps({"case": name, "host_us_per_call": host, "wall_us_per_call": wall, "n": a.n}), flush=True)


if __name__ == "__main__":
    main()
