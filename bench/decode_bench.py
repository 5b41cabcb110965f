"""Decode attention's peers (issue 38): one to a few query tokens against a long key cache, GQA,
bf16, one JSON line per (implementation, shape) in the format of ladle-bench-attention:
  {"op": "attention_decode", "impl": "sdpa-cudnn", "shape": "B64 Tq1 Tk8192 H32:8 D128 bf16", "ms": ..., "GBs": ...}
Peers: torch SDPA with its flash, cuDNN and memory-efficient backends (enable_gqa; where a backend
refuses GQA, k and v repeated to H heads beforehand, outside the timed region, and said so in the
note), FlexAttention (torch.compile; its decoding kernel for short queries), and flash_attn's
flash_attn_with_kvcache where flash_attn is installed. The attention is unmasked: a query at the
end of the cache sees every key (causal with the queries at the end is the same for Tq = 1).
Also "read-floor": torch.sum over K and V, the time to read them once on this GPU.
GB/s counts K and V read once plus q and o.
  python3 bench/decode_bench.py --shapes 64x1x8192 --heads 32 --kv-heads 8 --dim 128
"""
import argparse
import json

from attention_bench import bench  # medians of CUDA-event timings after warm-up runs


def emit(impl, shape, nbytes, ms=None, error=None, note=None):
    row = {"op": "attention_decode", "impl": impl, "shape": shape}
    if error is not None:
        row["error"] = error
    else:
        row["ms"] = ms
        row["GBs"] = nbytes / (ms * 1e-3) / 1e9
        row["TFLOPs"] = 0.0
    if note:
        row["note"] = note
    print(json.dumps(row), flush=True)


def run(shapes, H, H_kv, D):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for B, Tq, Tk in shapes:
        shape = f"B{B} Tq{Tq} Tk{Tk} H{H}:{H_kv} D{D} bf16"
        q = torch.randn(B, H, Tq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, H_kv, Tk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, H_kv, Tk, D, device="cuda", dtype=torch.bfloat16)
        nbytes = 2.0 * (k.numel() + v.numel() + 2 * q.numel())
        scale = D ** -0.5
        try:
            emit("read-floor", shape, nbytes, bench(lambda: (k.sum(), v.sum()), reps=50), note="torch.sum over K and V")
        except Exception as e:
            emit("read-floor", shape, nbytes, error=repr(e)[:300])
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                def fn():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
                emit(name, shape, nbytes, bench(fn, reps=50), note="enable_gqa")
            except Exception as e:
                try:  # the backend without GQA: k and v repeated to H heads (reads H/H_kv times the bytes)
                    kr, vr = k.repeat_interleave(H // H_kv, 1), v.repeat_interleave(H // H_kv, 1)

                    def fn():
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, kr, vr, scale=scale)
                    emit(name, shape, nbytes, bench(fn, reps=50), note=f"k, v repeated to {H} heads (no enable_gqa: {repr(e)[:80]})")
                    del kr, vr
                except Exception as e2:
                    emit(name, shape, nbytes, error=repr(e2)[:300])
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
            fn = lambda: flex(q, k, v, scale=scale, enable_gqa=True)
            fn()
            emit("flex", shape, nbytes, bench(fn, reps=50))
        except Exception as e:
            emit("flex", shape, nbytes, error=repr(e)[:300])
        try:
            from flash_attn import flash_attn_with_kvcache
            qf, kf, vf = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
            fn = lambda: flash_attn_with_kvcache(qf, kf, vf, softmax_scale=scale)
            emit("fa2-kvcache", shape, nbytes, bench(fn, reps=50), note="flash_attn_with_kvcache (split-KV)")
            del qf, kf, vf
        except Exception as e:
            emit("fa2-kvcache", shape, nbytes, error=repr(e)[:300])
        del q, k, v
        torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x1x8192", help="BxTqxTk, comma-separated")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as e:
        print(json.dumps({"error": f"torch with CUDA unavailable: {e!r}"}), flush=True)
        return
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    run(shapes, args.heads, args.kv_heads, args.dim)


if __name__ == "__main__":
    main()
