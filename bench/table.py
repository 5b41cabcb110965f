"""Reads the JSON lines of ladle's and fla's benchmarks (stdin) and prints one table:
per op and shape, each implementation's median time, and the byte floor."""
import json
import sys

rows, floors, copy = [], {}, {}
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        continue
    if "metric" in r:
        copy[r["metric"]] = r["value"]
    elif "error" in r:
        print("error:", r)
    else:
        rows.append(r)
        if "floor_ms" in r:
            floors[(r["op"], r["shape"])] = r["floor_ms"]
for name, value in copy.items():
    print(f"{name}: {value:.0f} GB/s")
print(f"{'op':<22} {'shape':<28} {'impl':<6} {'config':<18} {'ms':>8} {'x floor':>8} {'1st call ms':>11}")
for r in sorted(rows, key=lambda r: (r["op"], r["shape"], r["impl"], r["ms"])):
    floor = floors.get((r["op"], r["shape"]))
    ratio = f"{r['ms'] / floor:.1f}" if floor else "-"
    first = f"{r['first_call_ms']:.0f}" if "first_call_ms" in r else "-"
    impl = r["impl"] + ("/" + r["policy"] if "policy" in r else "")  # ladle/force: a tuning run
    config = r.get("tile", "") + (f" seg {r['segment_tokens']}" if r.get("segment_tokens", "auto") != "auto" else "")
    print(f"{r['op']:<22} {r['shape']:<28} {impl:<6} {config:<18} {r['ms']:>8.3f} {ratio:>8} {first:>11}")
for (op, shape), floor in floors.items():
    print(f"floor {op} {shape}: {floor:.3f} ms (bytes of q,k,v,g read once + o written once / copy bandwidth)")
