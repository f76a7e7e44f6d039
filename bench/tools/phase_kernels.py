"""Kernels inside chosen phases of an Anvil --profile_steps trace (Chrome trace JSON).

Usage: python3 bench/tools/phase_kernels.py TRACE.json [--step N] [--phase 'forward 5' ...] [--top N] [--gaps US]
Prints, per phase, its length and each kernel that starts inside it (GPU us, trace order), the GEMM share,
and a summary of the step's time by phase kind. Phases are the device-track ranges the trainer records
(names such as 'forward 5', 'backward 5', 'optimizer'). --gaps also prints the step's idle time on the
device: its span, the time its kernels were busy, the total of the gaps between them, and each gap of at
least US microseconds with the kernels on either side. A first step shows its one-time costs there
(cuBLASLt's first use, lazily loaded kernels) as gaps before the kernels that paid them; a steady step's
gaps are the launch latencies between its kernels.
"""
import argparse, collections, json, re

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--step", type=int, default=None, help="step to show (default: the first profiled one)")
ap.add_argument("--phase", action="append", default=[], help="phase name (repeatable); default: none")
ap.add_argument("--top", type=int, default=0, help="also list the N kernels (by name) taking most of the step")
ap.add_argument("--gaps", type=float, default=None, metavar="US",
                help="also report the step's idle time, listing the gaps of at least US microseconds")
a = ap.parse_args()
t = json.load(open(a.trace))
events = t["traceEvents"] if isinstance(t, dict) else t
x = [e for e in events if e.get("ph") == "X"]
phases = [e for e in x if e.get("pid") == 0 and e.get("tid") == 1]
kernels = sorted((e for e in x if e.get("pid") == 1), key=lambda e: e["ts"])
steps = sorted({p["args"]["step"] for p in phases})
step = a.step if a.step is not None else steps[0]
phases = [p for p in phases if p["args"]["step"] == step]
is_gemm = re.compile(r"gemm|sgemm|xmma|cutlass|splitKreduce", re.I)
for want in a.phase:
    for p in (p for p in phases if p["name"] == want):
        s, e = p["ts"], p["ts"] + p["dur"]
        ks = [k for k in kernels if s <= k["ts"] < e]
        tot = sum(k["dur"] for k in ks)
        g = sum(k["dur"] for k in ks if is_gemm.search(k["name"]))
        print(f"== {want}: phase {p['dur']:.0f} us; kernels {tot:.0f} us, of which GEMM {g:.0f} us")
        for k in ks:
            print(f"  {k['dur']:8.1f}  {k['name'][:110]}")
kind = collections.defaultdict(float)
for p in phases:
    kind[p["name"].split(" ")[0]] += p["dur"]
print(f"== step {step} by phase kind (us): " + ", ".join(f"{k} {v:.0f}" for k, v in kind.items()))
allk = collections.defaultdict(float)
byname = collections.defaultdict(lambda: [0.0, 0])
s0 = min(p["ts"] for p in phases)
e0 = max(p["ts"] + p["dur"] for p in phases)
for k in kernels:
    if s0 <= k["ts"] < e0:
        allk["GEMM" if is_gemm.search(k["name"]) else "other"] += k["dur"]
        b = byname[re.sub(r"\(.*", "", k["name"].replace("(anonymous namespace)", "anon"))[:100]]
        b[0] += k["dur"]
        b[1] += 1
if a.top:
    print(f"== step {step}: the {a.top} kernels taking most time (total us, launches, name)")
    for name, (us, n) in sorted(byname.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"  {us:9.1f} {n:5d}  {name}")
print(f"== step {step} kernels: GEMM {allk['GEMM']:.0f} us, other {allk['other']:.0f} us, step span {e0 - s0:.0f} us")
if a.gaps is not None:
    ks = [k for k in kernels if s0 <= k["ts"] < e0]
    gaps, end, before = [], s0, "(step start)"
    for k in ks:
        gaps.append((k["ts"] - end, before, k["name"]))
        end, before = max(end, k["ts"] + k["dur"]), k["name"]
    gaps.append((e0 - end, before, "(step end)"))
    busy = sum(k["dur"] for k in ks)
    idle = sum(g[0] for g in gaps if g[0] > 0)
    print(f"== step {step} on the device: span {(e0 - s0) / 1e3:.1f} ms, kernels busy {busy / 1e3:.1f} ms "
          f"({len(ks)} kernels), gaps {idle / 1e3:.2f} ms")
    for g in sorted(gaps, key=lambda g: -g[0]):
        if g[0] < a.gaps:
            break
        print(f"  {g[0] / 1e3:8.2f} ms after {g[1][:60]} | before {g[2][:60]}")
