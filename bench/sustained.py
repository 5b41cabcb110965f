"""Sustained timing mode (issue 38): ladle and its peers in one process, interleaved, each timed
back to back at sustained clocks.

A first timing after an idle spell runs at boost clocks (1980 MHz on an H100) and flatters whoever
goes first. Here every implementation of a case is compiled and run once, then all of them run
round-robin for --heat seconds of continuous load (the clocks settle where power and heat hold
them), and only then timed: --rounds rounds, each timing every implementation for --reps calls
back to back between two CUDA events (the mean of those calls), the order rotated each round. A
row reports the median round (and the fastest and slowest), the SM clock nvidia-smi read right
after the case, and "mode": "sustained". One JSON line per (case, shape, implementation):

  {"op": "attention_causal", "impl": "ladle", "shape": "B8 T4096 H16 D128 bf16", "mode": "sustained",
   "ms": ..., "ms_min": ..., "ms_max": ..., "TFLOPs": ..., "sm_mhz": ...}

Implementations: ladle (ladle.torch.attention, the installed package), SDPA with the cuDNN, flash
(FlashAttention-2) and efficient backends, FlexAttention (compiled), flash_attn's FA2 where it is
installed. Cases: causal, window_softcap (window (1024, 0) + soft cap 30), sinks_gqa (causal, GQA
16:2; ladle with 4 sinks, the peers without: none computes sinks), decode (--decode-shape, one or a
few query tokens against a key cache; its rows are bytes: K and V read once). --backward times
forward + backward instead (ops suffixed _fwd_bwd).

  python3 bench/sustained.py --cases causal,window_softcap --shapes 8x4096,2x16384 [--backward]
"""
import argparse
import json
import subprocess
import time

from attention_bench import attended_pairs  # this directory's: the pairs a mask leaves


def sm_clock_mhz():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10).stdout
        return int(out.split()[0])
    except Exception:
        return None


def implementations(case, B, T, H, D, backward, tq, hkv):
    """(name, callable) pairs for one case and shape; each callable runs one forward (+ backward)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    decode = case == "decode"
    Tq = tq if decode else T
    H_kv = hkv if decode else (2 if case == "sinks_gqa" else H)
    grad = backward and not decode
    # ladle's layout [B,T,H,D]; the peers' [B,H,T,D] as transposed views of the same storage.
    q = torch.randn(B, Tq, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
    k = torch.randn(B, T, H_kv, D, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
    v = torch.randn(B, T, H_kv, D, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
    do = torch.randn(B, Tq, H, D, device="cuda", dtype=torch.bfloat16)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(grad) for x in (q, k, v))
    dot = do.transpose(1, 2).contiguous()
    scale = D ** -0.5
    causal = case in ("causal", "sinks_gqa")
    out = []

    def with_backward(fwd, tensors, d):
        if not grad:
            return fwd

        def fn():
            for t in tensors:
                t.grad = None
            fwd().backward(d)
        return fn

    try:
        import ladle.torch as lt
        kwargs = {"scale": scale, "causal": causal}
        if case == "window_softcap":
            kwargs.update(window=(1024, 0), softcap=30.0)
        if case == "sinks_gqa":
            kwargs["sinks"] = torch.zeros(H, 4, device="cuda", dtype=torch.float32)
        out.append(("ladle", with_backward(lambda: lt.attention(q, k, v, **kwargs), (q, k, v), do)))
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"impl": "ladle", "error": f"ladle.torch unavailable: {e!r}"}), flush=True)

    if case != "window_softcap":  # SDPA has no window with a soft cap
        for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal and not decode, scale=scale,
                                                          enable_gqa=H_kv != H)
            out.append((name, with_backward(sdpa, (qt, kt, vt), dot)))
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
        score_mod, block_mask = None, None
        if causal:
            block_mask = create_block_mask(lambda b, h, i, j: j <= i + (T - Tq), None, None, Tq, T, device="cuda")
        if case == "window_softcap":
            block_mask = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j <= 1024), None, None, Tq, T, device="cuda")

            def score_mod(s, b, h, i, j):
                return 30.0 * torch.tanh(s / 30.0)
        gqa = H_kv != H
        out.append(("flex", with_backward(lambda: flex(qt, kt, vt, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                                       enable_gqa=gqa), (qt, kt, vt), dot)))
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"impl": "flex", "error": repr(e)}), flush=True)
    try:
        import flash_attn
        win = (1024, 0) if case == "window_softcap" else (-1, -1)
        cap = 30.0 if case == "window_softcap" else 0.0
        out.append(("fa2", with_backward(lambda: flash_attn.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                                                           window_size=win, softcap=cap), (q, k, v), do)))
    except Exception:  # not installed: no row
        pass
    return out


def time_round(fn, reps):
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def run(case, B, T, H, D, args):
    import torch
    decode = case == "decode"
    impls = implementations(case, B, T, H, D, args.backward, args.tq, args.hkv)
    live = []
    for name, fn in impls:  # compile, tune and check each once, untimed
        try:
            start = time.time()
            fn()
            fn()
            torch.cuda.synchronize()
            live.append((name, fn, time.time() - start))
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"op": f"attention_{case}", "impl": name, "error": repr(e)[:300]}), flush=True)
    start = time.time()
    while time.time() - start < args.heat:  # continuous load: the clocks settle
        for _, fn, _ in live:
            fn()
        torch.cuda.synchronize()
    times = {name: [] for name, _, _ in live}
    for r in range(args.rounds):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for name, fn, _ in order:
            times[name].append(time_round(fn, args.reps))
    mhz = sm_clock_mhz()
    H_kv = args.hkv if decode else (2 if case == "sinks_gqa" else H)
    Tq = args.tq if decode else T
    shape = (f"B{B} Tq{Tq} Tk{T}" if decode else f"B{B} T{T}") + f" H{H}" + (f":{H_kv}" if H_kv != H else "") + f" D{D} bf16"
    if decode:
        work, unit = 2.0 * B * T * H_kv * D * 2 / 1e9, "GBs"  # K and V read once
    else:
        pairs = attended_pairs(T, case != "window_softcap", 1024 if case == "window_softcap" else -1, 0 if case == "window_softcap" else -1)
        work, unit = 4.0 * D * pairs * B * H * (3.5 if args.backward else 1.0) / 1e12, "TFLOPs"
    op = f"attention_{case}" + ("_fwd_bwd" if args.backward and not decode else "")
    for name, _, first_s in live:
        ts = sorted(times[name])
        ms = ts[len(ts) // 2]
        print(json.dumps({"op": op, "impl": name, "shape": shape, "mode": "sustained", "ms": round(ms, 4), "ms_min": round(ts[0], 4),
                          "ms_max": round(ts[-1], 4), unit: round(work / (ms * 1e-3), 1), "sm_mhz": mhz,
                          "first_calls_s": round(first_s, 2)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="causal,window_softcap")
    parser.add_argument("--shapes", default="8x4096,2x16384", help="BxT, comma-separated (decode: B x keys)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--tq", type=int, default=1, help="decode: query tokens")
    parser.add_argument("--hkv", type=int, default=8, help="decode: key/value heads")
    parser.add_argument("--backward", action="store_true", help="forward + backward")
    parser.add_argument("--heat", type=float, default=5.0, help="seconds of continuous load before timing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10, help="calls timed back to back per round")
    args = parser.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"error": f"torch with CUDA unavailable: {e!r}"}), flush=True)
        return
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "idle_sm_mhz": sm_clock_mhz()}), flush=True)
    for case in args.cases.split(","):
        for shape in args.shapes.split(","):
            B, T = (int(x) for x in shape.split("x"))
            run(case, B, T, args.heads, args.dim, args)


if __name__ == "__main__":
    main()
