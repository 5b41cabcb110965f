"""Where the GPU time of one attention training step from PyTorch goes (issue 38): ladle.torch.attention
forward + backward beside SDPA's cuDNN backend, each under torch.profiler after a warm-up, at one shape.
Prints, per implementation, the wall time of a step (CUDA events, mean of --n steps after --heat seconds of
load) and every kernel the profiler saw, with its GPU time a step; the rows' sum against the wall time is
what the host, the gaps and the conversions cost. One JSON line per implementation:

  {"impl": "ladle", "shape": ..., "step_ms": ..., "kernels_ms": ..., "kernels": [[name, ms, calls a step], ...]}

  python3 bench/attention_trace.py --shape 8x4096 --heads 16 --dim 128 [--case causal|window_softcap]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import ladle.torch as lt


def steps(args):
    B, T = (int(x) for x in args.shape.split("x"))
    H, D = args.heads, args.dim
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2).contiguous()
    window = args.case == "window_softcap"

    def ladle_step():
        o = lt.attention(q, k, v, causal=not window, window=(1024, 0) if window else None, softcap=30.0 if window else None)
        o.backward(do)
        q.grad = k.grad = v.grad = None

    def cudnn_step():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        o.backward(dot)
        qt.grad = kt.grad = vt.grad = None

    out = [("ladle", ladle_step)]
    if not window:
        out.append(("cudnn", cudnn_step))
    return f"B{B} T{T} H{H} D{D} bf16 {args.case}", out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8x4096")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--case", default="causal", choices=["causal", "window_softcap"])
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--heat", type=float, default=3.0)
    args = p.parse_args()
    shape, impls = steps(args)
    for name, step in impls:
        step()
        torch.cuda.synchronize()
        end = time.time() + args.heat
        while time.time() < end:
            step()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.n):
            step()
        stop.record()
        stop.synchronize()
        step_ms = start.elapsed_time(stop) / args.n
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.n):
                step()
            torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if t > 0:
                rows.append([e.key[:90], round(t / 1000 / args.n, 4), e.count / args.n])
        rows.sort(key=lambda r: -r[1])
        print(json.dumps({"impl": name, "shape": shape, "step_ms": round(step_ms, 4),
                          "kernels_ms": round(sum(r[1] for r in rows), 4), "kernels": rows}), flush=True)


if __name__ == "__main__":
    main()
