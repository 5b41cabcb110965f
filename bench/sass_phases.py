#!/usr/bin/env python3
"""Sums an Nsight Compute SASS source export between the kernel's barriers.

  ncu --import prof.ncu-rep --page source --csv --print-source sass > sass.csv
  python3 bench/sass_phases.py sass.csv[.gz]

Each phase is the run of instructions (in address order) that ends at a BAR instruction; per
phase: its share of the warp stall samples and of the executed instructions, its largest stall
reasons (where the export has a column per reason) and the opcodes that took the most samples.
Then the whole kernel by opcode (with its first modifier: MUFU.EX2, HGMMA.64x128x16): executed
instructions and stall samples, the largest first.
"""
import csv, gzip, io, sys
from collections import Counter


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main(path):
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rt", errors="replace").read()
    rows = list(csv.reader(io.StringIO(raw)))
    head = next(i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r))
    names = [c.strip() for c in rows[head]]
    col = lambda *keys: next((i for i, n in enumerate(names) if all(k.lower() in n.lower() for k in keys)), None)
    src, samples = col("Source"), col("Sampling", "All")
    executed = col("Instructions Executed")
    if samples is None:
        samples = col("Sampling")
    reasons = [i for i, n in enumerate(names) if n.startswith("stall_") or n.lower().startswith("warp stall sampling (") and "All" not in n and "Not" not in n]
    reasons = [i for i in reasons if i not in (samples,)]
    phases, cur = [], None
    by_opcode = {}
    for r in rows[head + 1:]:
        if len(r) <= max(src, samples):
            continue
        text = r[src].strip()
        if cur is None:
            cur = {"first": r[0], "samples": 0.0, "executed": 0.0, "ops": Counter(), "why": Counter(), "n": 0}
        s = number(r[samples])
        cur["samples"] += s
        cur["executed"] += number(r[executed]) if executed is not None else 0.0
        cur["ops"][text.split(" ")[0].lstrip("@!P0123456789T ").split(".")[0] or text[:12]] += s
        for i in reasons:
            cur["why"][names[i]] += number(r[i])
        cur["n"] += 1
        words = [w for w in text.replace(";", " ").split(" ") if w and not w.startswith("@")]
        opcode = ".".join(words[0].split(".")[:2]) if words else "?"
        e, smp = by_opcode.get(opcode, (0.0, 0.0))
        by_opcode[opcode] = (e + (number(r[executed]) if executed is not None else 0.0), smp + s)
        if text.split(" ")[-1].startswith("BAR") or " BAR" in text or text.startswith("BAR"):
            cur["last"] = r[0]
            phases.append(cur)
            cur = None
    if cur:
        cur["last"] = "end"
        phases.append(cur)
    total_s = sum(p["samples"] for p in phases) or 1.0
    total_e = sum(p["executed"] for p in phases) or 1.0
    print(f"{len(phases)} phases, {total_s:.0f} samples, {total_e:.0f} warp instructions executed")
    for k, p in enumerate(phases):
        ops = ", ".join(f"{o} {v / total_s * 100:.1f}" for o, v in p["ops"].most_common(5) if v > 0)
        why = ", ".join(f"{w.replace('Warp Stall Sampling ', '')} {v / total_s * 100:.1f}" for w, v in p["why"].most_common(3) if v > 0)
        print(f"phase {k:2d} [{p['first']}..{p['last']}] {p['n']:5d} instr: samples {p['samples'] / total_s * 100:5.1f} %, "
              f"executed {p['executed'] / total_e * 100:5.1f} %  | {ops}" + (f"  | {why}" if why else ""))

    print("by opcode (executed % / samples %):")
    for opcode, (e, smp) in sorted(by_opcode.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"  {opcode:24s} {e / total_e * 100:6.2f} % {smp / total_s * 100:6.2f} %  ({e:.0f})")


if __name__ == "__main__":
    main(sys.argv[1])
