"""Times the peers ladle is compared with, on the GPU, in the same run as ladle's own
benchmarks (bench/gpu-check.sh calls this). Prints one JSON object per line:
  {"op": ..., "impl": "fla", "shape": "B8 T4096 H16 K128 V128 bf16", "ms": ...}
plus the measured copy bandwidth used for the byte floor. Inputs are random (never zeros);
timings are medians of triton.testing.do_bench (CUDA events, warm-up first)."""
import argparse
import json
import time
import sys

import torch
import triton


def bench(fn, warmup=50, rep=300):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def copy_bandwidth():
    n = 1 << 30  # 1 GiB each way
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * n / (ms * 1e-3) / 1e9  # GB/s, bytes read + written


def gla_inputs(B, T, H, K, V, dtype, gate):
    torch.manual_seed(0)
    q = torch.randn(B, T, H, K, device="cuda", dtype=dtype)
    k = torch.randn(B, T, H, K, device="cuda", dtype=dtype)
    v = torch.randn(B, T, H, V, device="cuda", dtype=dtype)
    # GLA's gate: logsigmoid of a raw input over 16, as the GLA paper and fla's layer do.
    g = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")) / 16).to(dtype) if gate else None
    return q, k, v, g


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="fused_recurrent_gla")
    parser.add_argument("--shapes", default="8x4096x16x128x128")
    parser.add_argument("--profile", action="store_true", help="one more call between cudaProfilerStart and Stop, for ncu")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--backward", action="store_true",
                        help="time the forward and the backward together (o.backward(do) on q, k, v and the gate)")
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    print(json.dumps({"metric": "copy_bandwidth_GBps", "value": copy_bandwidth()}), flush=True)
    try:
        from fla.ops.gla import chunk_gla, fused_recurrent_gla
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # noqa: BLE001 - report any import failure and keep going
        print(json.dumps({"error": f"fla import failed: {e!r}"}), flush=True)
        return 1
    update_forms = {}
    try:  # the update forms (issue 14); fla 0.6 has each of these
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        from fla.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
        update_forms = dict(chunk_delta_rule=chunk_delta_rule, fused_recurrent_delta_rule=fused_recurrent_delta_rule,
                            chunk_gated_delta_rule=chunk_gated_delta_rule,
                            fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule,
                            chunk_rwkv6=chunk_rwkv6, fused_recurrent_rwkv6=fused_recurrent_rwkv6)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"error": f"fla update-form import failed: {e!r}"}), flush=True)
    try:
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
        update_forms.update(chunk_kda=chunk_kda, fused_recurrent_kda=fused_recurrent_kda)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"error": f"fla kda import failed: {e!r}"}), flush=True)
    for shape in args.shapes.split(","):
        B, T, H, K, V = map(int, shape.split("x"))
        label = f"B{B} T{T} H{H} K{K} V{V} {args.dtype}"
        for op in args.ops.split(","):
            q, k, v, g = gla_inputs(B, T, H, K, V, dtype, gate=op != "chunk_simple_gla")
            if op == "fused_recurrent_gla":
                fn = lambda: fused_recurrent_gla(q, k, v, gk=g)
            elif op == "chunk_gla":
                fn = lambda: chunk_gla(q, k, v, g)
            elif op == "chunk_simple_gla":
                g_gamma = -torch.rand(H, device="cuda", dtype=torch.float32) * 0.1 - 0.01
                fn = lambda: chunk_simple_gla(q, k, v, g_gamma=g_gamma)
            elif op in update_forms:
                # As ladle-bench-recurrent makes them: beta = sigmoid(x) [B,T,H], g = logsigmoid(x)/16
                # [B,T,H], q and k L2-normalised in the kernel; rwkv6: w = logsigmoid(x)/16 [B,T,H,K], u [H,K].
                f = update_forms[op]
                beta = torch.sigmoid(torch.randn(B, T, H, device="cuda")).to(dtype)
                g_head = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda")) / 16).float()
                u = 0.5 * torch.sin(0.37 * torch.arange(H * K, device="cuda", dtype=torch.float32)).reshape(H, K).to(dtype)
                if op.endswith("kda"):  # KDA: g [B,T,H,K] = logsigmoid(x)/16 in fp32, beta as above, L2 in the kernel
                    fn = lambda: f(q, k, v, g.float(), beta, use_qk_l2norm_in_kernel=True)
                elif op.endswith("gated_delta_rule"):
                    fn = lambda: f(q, k, v, g_head, beta, use_qk_l2norm_in_kernel=True)
                elif op.endswith("delta_rule"):
                    fn = lambda: f(q, k, v, beta, use_qk_l2norm_in_kernel=True)
                else:
                    fn = lambda: f(q, k, v, g, u)
            else:
                print(json.dumps({"error": f"unknown op {op}"}), flush=True)
                continue
            grads = []
            if args.backward:
                forward = fn
                leaves = [x for x in (q, k, v, g) if x is not None]  # simple GLA: g_gamma is a constant here
                for x in leaves:
                    x.requires_grad_(True)
                do = torch.randn(B, T, H, V, device="cuda", dtype=dtype)

                def fn():
                    forward()[0].backward(do)
                grads = leaves
            start = time.perf_counter()
            fn()  # compile / autotune outside the timing; its wall time is the first call's cost
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - start) * 1e3
            ms = triton.testing.do_bench(fn, warmup=50, rep=300, grad_to_none=grads or None, return_mode="median")
            print(json.dumps({"op": op + ("_fwd_bwd" if args.backward else ""), "impl": "fla", "shape": label, "ms": ms,
                              "first_call_ms": first_ms}), flush=True)
            if args.profile:  # one more call inside cudaProfilerStart/Stop: ncu --profile-from-start off sees its kernels
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
