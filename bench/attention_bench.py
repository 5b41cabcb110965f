"""Times the peers of ladle's softmax attention at H16 D128 bf16 (issue 6), one JSON line per
(case, shape, implementation), in the format of tools/ladle-bench/attention.cpp:
  {"op": "attention_causal", "impl": "sdpa-flash", "shape": "B8 T4096 H16 D128 bf16", "ms": ..., "TFLOPs": ...}
Cases:
  causal            SDPA (flash, cuDNN backends) and FlexAttention (torch.compile), causal mask
  window_softcap    sliding window (1024, 0) + soft cap 30: FlexAttention only (SDPA has
                    neither a window nor a soft cap)
  sinks_gqa         causal + 4 sinks + GQA 16:2: no peer computes sinks. FlexAttention's
                    score_mod rewrites one score at a time and cannot add logits to the
                    denominator only; SDPA has no sinks either. Both are timed on causal + GQA
                    without sinks and labelled so (the nearest work, a lower bound on theirs).
With --backward, times forward + backward instead (q, k, v require grad; a fixed random d_output
`do` made once outside the timed region; timed: o = fwd(q, k, v); o.backward(do)), with op names
suffixed _fwd_bwd (e.g. "attention_causal_fwd_bwd") and TFLOPs counting 3.5x the forward's FLOPs
(forward 2 matmuls + backward 5 = 7 matmul units against the forward's 2).
With --table, reads these lines (ladle's and the peers') from stdin and prints one table.
"""
import argparse
import json
import sys
import time


def attended_pairs(T, causal, left=-1, right=-1):
    pairs = 0
    for i in range(T):
        lo, hi = 0, T - 1
        if causal:
            hi = min(hi, i)
        if left >= 0:
            lo = max(lo, i - left)
        if right >= 0:
            hi = min(hi, i + right)
        pairs += max(0, hi - lo + 1)
    return pairs


REPEAT = 1
BWD_FLOPS = 3.5  # fwd + bwd: 2 + 5 matmul units over the forward's 2


def fwd_bwd(fwd, q, k, v, do):
    """The forward fwd() followed by its backward with the fixed d_output do; the grads are dropped
    first, so that backward stores them rather than accumulating into the last call's."""
    def fn():
        q.grad = k.grad = v.grad = None
        fwd().backward(do)
    return fn


def bench(fn, reps=20):
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def emit(op, impl, shape, ms=None, flops=None, error=None, note=None):
    row = {"op": op, "impl": impl, "shape": shape}
    if error is not None:
        row["error"] = error
    else:
        row["ms"] = ms
        row["TFLOPs"] = flops / (ms * 1e-3) / 1e12
    if note:
        row["note"] = note
    print(json.dumps(row), flush=True)


def run(cases, shapes, H=16, D=128, window=1024, cap=30.0, backward=False):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # older torch
        flex = None
        print(json.dumps({"error": f"FlexAttention unavailable: {e!r}"}), flush=True)

    for B, T in shapes:
        for case in cases:
            H_kv = 2 if case == "sinks_gqa" else H
            shape = f"B{B} T{T} H{H}" + (f":{H_kv}" if H_kv != H else "") + f" D{D} bf16"
            op = f"attention_{case}" + ("_fwd_bwd" if backward else "")
            q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16).requires_grad_(backward)
            k = torch.randn(B, H_kv, T, D, device="cuda", dtype=torch.bfloat16).requires_grad_(backward)
            v = torch.randn(B, H_kv, T, D, device="cuda", dtype=torch.bfloat16).requires_grad_(backward)
            do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) if backward else None  # o's shape
            if case == "window_softcap":
                flops = 4.0 * D * attended_pairs(T, False, window, 0) * B * H
            else:
                flops = 4.0 * D * attended_pairs(T, True) * B * H
            if backward:
                flops *= BWD_FLOPS
            gqa = H_kv != H
            note = "without sinks (no sinks in this API)" if case == "sinks_gqa" else None

            if case in ("causal", "sinks_gqa"):
                for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        def fn():
                            with sdpa_kernel(backend):
                                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
                        if backward:
                            fn = fwd_bwd(fn, q, k, v, do)
                        for rep in range(REPEAT):  # back to back: the sustained clocks after the first
                            emit(op, name, shape, bench(fn), flops, note=note if REPEAT == 1 else f"{note or ''} run {rep + 1}".strip())
                    except Exception as e:
                        emit(op, name, shape, error=repr(e)[:300])
            if flex is None:
                continue
            try:
                if case == "window_softcap":
                    def mask_mod(b, h, q_idx, kv_idx):
                        return (kv_idx <= q_idx) & (q_idx - kv_idx <= window)

                    def score_mod(score, b, h, q_idx, kv_idx):
                        return cap * torch.tanh(score / cap)
                else:
                    def mask_mod(b, h, q_idx, kv_idx):
                        return kv_idx <= q_idx
                    score_mod = None
                block_mask = create_block_mask(mask_mod, None, None, T, T, device="cuda")
                fn = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)
                if backward:
                    fn = fwd_bwd(fn, q, k, v, do)
                first = time.perf_counter()
                fn()  # compiles (forward and, with --backward, backward)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - first
                ms = bench(fn)
                emit(op, "flex", shape, ms, flops, note=(note or "") + f" (compile {compile_s:.1f} s)")
            except Exception as e:
                emit(op, "flex", shape, error=repr(e)[:300])
            del q, k, v, do
            torch.cuda.empty_cache()


def table():
    rows = []
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "error" in r:
            print("error:", r)
        elif "ms" in r:
            rows.append(r)
    w = max([26] + [len(r["op"]) for r in rows])  # the _fwd_bwd op names are longer
    print(f"{'case':<{w}} {'shape':<26} {'impl':<11} {'config':<40} {'ms':>8} {'TFLOP/s':>8}  note")
    for r in sorted(rows, key=lambda r: (r["op"], r["shape"], r["ms"])):
        print(f"{r['op']:<{w}} {r['shape']:<26} {r['impl']:<11} {r.get('tile', ''):<40} {r['ms']:>8.3f} "
              f"{r['TFLOPs']:>8.1f}  {r.get('note', '')}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="causal,window_softcap,sinks_gqa")
    parser.add_argument("--shapes", default="8x4096,2x16384", help="BxT, comma-separated")
    parser.add_argument("--table", action="store_true", help="print a table of the JSON lines on stdin")
    parser.add_argument("--repeat", type=int, default=1, help="time each SDPA backend this many times back to back")
    parser.add_argument("--backward", action="store_true",
                        help="time forward + backward (ops suffixed _fwd_bwd, TFLOPs at 3.5x the forward's FLOPs)")
    parser.add_argument("--dim", type=int, default=128, help="head dim (D = Dv)")
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)
    if args.table:
        table()
        return
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as e:
        print(json.dumps({"error": f"torch with CUDA unavailable: {e!r}"}), flush=True)
        return
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    run(args.cases.split(","), shapes, H=args.heads, D=args.dim, backward=args.backward)


if __name__ == "__main__":
    main()
