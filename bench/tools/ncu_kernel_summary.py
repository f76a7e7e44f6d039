import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
agg = collections.defaultdict(lambda: [0, 0.0])
seq = []
for r in rows:
    if hdr is None:
        if "Kernel Name" in r: hdr = r
        continue
    d = dict(zip(hdr, r))
    if d.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(d["Metric Value"].replace(",", ""))
    unit = d.get("Metric Unit", "")
    us = v / 1000 if unit == "nsecond" else v if unit == "usecond" else v * 1000
    name = d["Kernel Name"][:90]
    agg[name][0] += 1; agg[name][1] += us
    seq.append((name, us))
tot = sum(v[1] for v in agg.values())
print(f"total {tot/1000:.2f} ms over {sum(v[0] for v in agg.values())} kernels")
for n, (c, us) in sorted(agg.items(), key=lambda x: -x[1][1])[:40]:
    print(f"{us/1000:8.3f} ms {100*us/tot:5.1f}% x{c:4d}  {n}")
print("--- sequence ---")
for n, us in seq[:80]: print(f"{us:9.1f} us  {n}")
