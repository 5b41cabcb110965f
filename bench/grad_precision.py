"""Gradient precision of ladle and of fla against an fp64 oracle, on the same inputs.

Each DIR was written by ladle's C++ tool: meta.json ({"op", "B", "T", "H", "K", "V", "scale",
"tensors": {name: shape}}) and one raw little-endian float32 file <name>.bin per tensor: the inputs
q, k, v, do, the gate (g for gla / simple_gla, g_gamma [H] for g_gamma, x and tau for user) and
ladle's gradients ladle_d* (ladle_dg_gamma optional).
The oracle runs the recurrence S_t = diag(exp(a_t)) S_{t-1} + k_t^T v_t, o_t = scale * q_t S_t in
float64 (loss = sum(o * do)) and backpropagates; fla (chunk_gla / chunk_simple_gla, bf16 q k v, fp32
gate) is run for gla, simple_gla and g_gamma. Prints one JSON line per (op, gradient) with the relative
error ||got - ref|| / ||ref|| of each, then a Markdown table.
Run: python3 bench/grad_precision.py DIR [DIR ...] [--cpu-oracle]   (bench/grad-precision.sh calls it)
"""
import argparse
import inspect
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

GATES = {"gla": ["g"], "simple_gla": ["g"], "g_gamma": ["g_gamma"], "user": ["x", "tau"]}
OPTIONAL = {"ladle_dg_gamma"}  # a constant per-head decay may come without ladle's gradient


def fail(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def check_dir(d):
    """Validates a directory (files present, element counts) and returns its meta."""
    path = os.path.join(d, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    op = meta.get("op")
    if op not in GATES:
        fail(f"{path}: unknown op {op!r}")
    B, T, H, K, V = (meta.get(n) for n in "BTHKV")
    if not all(isinstance(n, int) and n > 0 for n in (B, T, H, K, V)) or "scale" not in meta:
        fail(f"{path}: B, T, H, K, V must be positive ints and scale present")
    want = {"q": [B, T, H, K], "k": [B, T, H, K], "v": [B, T, H, V], "do": [B, T, H, V]}
    want.update({"gla": {"g": [B, T, H, K]}, "simple_gla": {"g": [B, T, H]}, "g_gamma": {"g_gamma": [H]},
                 "user": {"x": [B, T, H, K], "tau": [H]}}[op])
    want.update({"ladle_d" + n: s for n, s in list(want.items()) if n != "do"})
    tensors = meta.get("tensors", {})
    for name, shape in want.items():
        if name not in tensors and name in OPTIONAL:
            continue
        if name not in tensors:
            fail(f"{path}: tensor {name} missing from 'tensors'")
        if list(tensors[name]) != shape:
            fail(f"{path}: {name} has shape {tensors[name]}, expected {shape}")
    for name, shape in tensors.items():
        file = os.path.join(d, name + ".bin")
        if not os.path.isfile(file):
            fail(f"{file}: missing")
        n = math.prod(shape)
        if os.path.getsize(file) != 4 * n:
            fail(f"{file}: {os.path.getsize(file)} bytes, expected {4 * n} ({n} float32 for shape {shape})")
    return meta


def load(d, meta, name):
    with open(os.path.join(d, name + ".bin"), "rb") as f:
        buf = bytearray(f.read())
    return torch.frombuffer(buf, dtype=torch.float32).reshape(meta["tensors"][name]).clone()


def oracle(op, t, scale, dev):
    """fp64 reference gradients of sum(o * do) for the inputs and the gate inputs."""
    x = {n: t[n].to(dev, torch.float64).requires_grad_(n != "do") for n in ["q", "k", "v", "do"] + GATES[op]}
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    B, T, H, K = q.shape
    if op == "gla":
        a = x["g"]
    elif op == "simple_gla":
        a = x["g"].unsqueeze(-1).expand(B, T, H, K)
    elif op == "g_gamma":
        a = x["g_gamma"].view(1, 1, H, 1).expand(B, T, H, K)
    else:
        a = F.logsigmoid(x["x"]) / x["tau"].view(1, 1, H, 1)
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64, device=dev)
    outs = []
    for i in range(T):
        S = S * torch.exp(a[:, i]).unsqueeze(-1) + k[:, i].unsqueeze(-1) * v[:, i].unsqueeze(-2)
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, i], S))
    o = torch.stack(outs, dim=1)
    (o * do).sum().backward()
    return {"d" + n: x[n].grad.detach() for n in ["q", "k", "v"] + GATES[op]}


def import_fla():
    try:
        import fla
        from fla.ops.gla import chunk_gla
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # noqa: BLE001 - any failure is reported, fla then counts as null
        print(f"fla import failed: {e!r}; fla columns are null", flush=True)
        return None, None
    fns = {"gla": chunk_gla, "simple_gla": chunk_simple_gla}
    if "g_gamma" in inspect.signature(chunk_simple_gla).parameters:
        fns["g_gamma"] = chunk_simple_gla
    else:
        print("this fla's chunk_simple_gla takes no g_gamma; fla is null for g_gamma", flush=True)
    return fns, getattr(fla, "__version__", "unknown")


def run_fla(fn, op, t, scale):
    x = {n: t[n].to("cuda", torch.bfloat16).requires_grad_() for n in ["q", "k", "v"]}
    gate = GATES[op][0]  # g, or g_gamma
    x[gate] = t[gate].to("cuda", torch.float32).requires_grad_()
    kwargs = dict(scale=scale, output_final_state=False, **{gate: x[gate]})
    if "head_first" in inspect.signature(fn).parameters:
        kwargs["head_first"] = False  # old fla defaulted to [B, H, T, ...]
    out = fn(x["q"], x["k"], x["v"], **kwargs)
    o = out[0] if isinstance(out, (tuple, list)) else out
    o.backward(t["do"].to("cuda", o.dtype))
    torch.cuda.synchronize()
    return {"d" + n: x[n].grad for n in ["q", "k", "v", gate]}  # fla may leave dg_gamma None


def rel_err(got, ref):
    got = got.detach().to(ref.device, torch.float64)
    if not torch.isfinite(got).all():
        return math.inf
    diff, norm = torch.linalg.vector_norm(got - ref).item(), torch.linalg.vector_norm(ref).item()
    if norm == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / norm


def ratio(a, b):
    if a is None or b is None:
        return None
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def fmt(x, ratio_fmt=False):
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.2f}" if ratio_fmt else f"{x:.1e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dirs", nargs="+", metavar="DIR")
    parser.add_argument("--cpu-oracle", action="store_true", help="run the fp64 oracle on the CPU")
    parser.add_argument("--fla-ops", default="gla,simple_gla,g_gamma",
                        help="the ops fla runs for, comma-separated (empty: none; its first backward compiles for minutes)")
    args = parser.parse_args()
    metas = [check_dir(d) for d in args.dirs]  # every directory is validated before any work
    cuda = torch.cuda.is_available()
    dev = "cpu" if args.cpu_oracle or not cuda else "cuda"
    wanted = {o for o in args.fla_ops.split(",") if o}
    fns, fla_version = import_fla() if wanted else (None, None)
    if not wanted:
        print("fla not run (--fla-ops is empty): fla columns are null", flush=True)
    elif fns is not None:
        fns = {o: f for o, f in fns.items() if o in wanted}
    if fns is not None and not cuda:
        print("fla skipped: no CUDA device; fla columns are null", flush=True)
        fns = None
    gpu = torch.cuda.get_device_name(0) if cuda else "none"
    print(f"fla {fla_version}  torch {torch.__version__}  GPU {gpu}  oracle on {dev}", flush=True)
    rows = []
    for d, meta in zip(args.dirs, metas):
        op, scale = meta["op"], float(meta["scale"])
        shape = "B{B} T{T} H{H} K{K} V{V}".format(**meta)
        t = {n: load(d, meta, n) for n in meta["tensors"]}
        ref = oracle(op, t, scale, dev)
        fla = None
        if fns is not None and op in fns:
            start = time.time()
            try:
                fla = run_fla(fns[op], op, t, scale)
                print(f"fla {op} {shape}: {time.time() - start:.0f} s (first calls autotune)", file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 - reported, the row's fla is then null
                print(f"fla failed on {d} ({op} {shape}): {e!r}; fla columns are null", flush=True)
        ladle = {g: rel_err(t["ladle_" + g], r) if "ladle_" + g in t else None for g, r in ref.items()}
        for g, r in ref.items():
            fla_err = rel_err(fla[g], r) if fla is not None and fla[g] is not None else None
            label = op + (f" ({meta['gate_gradients']})" if meta.get("gate_gradients") else "")
            row = {"op": label, "shape": shape, "grad": g, "ladle": ladle[g], "fla": fla_err,
                   "ladle_over_fla": ratio(ladle[g], fla_err), "ladle_over_ladle_dq": ratio(ladle[g], ladle["dq"])}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del t, ref, fla
        if cuda:
            torch.cuda.empty_cache()
    print()
    print("| op | shape | gradient | ladle | fla " + (fla_version or "(none)") + " | ladle / fla | ladle / ladle dq |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['shape']} | {r['grad']} | {fmt(r['ladle'])} | {fmt(r['fla'])} | "
              f"{fmt(r['ladle_over_fla'], True)} | {fmt(r['ladle_over_ladle_dq'], True)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
