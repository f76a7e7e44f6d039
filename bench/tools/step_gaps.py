"""Idle time inside the profiled steps of an Anvil --profile_steps trace (Chrome trace JSON).

Usage: python3 bench/tools/step_gaps.py TRACE.json [--min_gap_us 200] [--top 15]
Prints, per profiled step: its span on the device, the time its kernels were busy, the total of the gaps
between them, the largest gaps (with the kernels on either side) and the time by phase kind. A first step
shows the one-time costs (cuBLASLt's first use, lazily loaded kernels) as gaps before the kernels that paid
them; a steady step's gaps are the launch latencies between its kernels.
"""
import argparse, collections, json

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--min_gap_us", type=float, default=200, help="list gaps at least this long (us)")
ap.add_argument("--top", type=int, default=15, help="list at most this many gaps a step")
a = ap.parse_args()
t = json.load(open(a.trace))
events = t["traceEvents"] if isinstance(t, dict) else t
x = [e for e in events if e.get("ph") == "X"]
phases = [e for e in x if e.get("pid") == 0 and e.get("tid") == 1]
kernels = sorted((e for e in x if e.get("pid") == 1), key=lambda e: e["ts"])
for step in sorted({p["args"]["step"] for p in phases}):
    ph = [p for p in phases if p["args"]["step"] == step]
    s0, s1 = min(p["ts"] for p in ph), max(p["ts"] + p["dur"] for p in ph)
    ks = [k for k in kernels if s0 <= k["ts"] < s1]
    busy = sum(k["dur"] for k in ks)
    gaps, end, before = [], s0, "(step start)"
    for k in ks:
        gaps.append((k["ts"] - end, before, k["name"]))
        end, before = max(end, k["ts"] + k["dur"]), k["name"]
    gaps.append((s1 - end, before, "(step end)"))
    idle = sum(g[0] for g in gaps if g[0] > 0)
    print(f"== step {step}: span {(s1 - s0) / 1e3:.1f} ms, kernels busy {busy / 1e3:.1f} ms ({len(ks)} kernels), "
          f"gaps {idle / 1e3:.2f} ms")
    for g in sorted(gaps, key=lambda g: -g[0])[: a.top]:
        if g[0] < a.min_gap_us:
            break
        print(f"  {g[0] / 1e3:8.2f} ms after {g[1][:60]} | before {g[2][:60]}")
    kind = collections.defaultdict(float)
    for p in ph:
        kind[p["name"].split(" ")[0]] += p["dur"]
    print("  by phase kind (us): " + ", ".join(f"{k} {v:.0f}" for k, v in kind.items()))
