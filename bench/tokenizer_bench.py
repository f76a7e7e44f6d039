#!/usr/bin/env python3
"""One-core tokenizer throughput: `anvil tokenize` vs Hugging Face `tokenizers` on the same text.

Trains a byte-level BPE with `tokenizers` on the text (ByteLevelBPETokenizer, --vocab_size), then encodes
the text line by line with both, pinned to one CPU core (taskset) and single-threaded (RAYON_NUM_THREADS=1,
plain encode() per line, no encode_batch), best of --repeats runs. Reports MB/s of the input text:

  anvil end-to-end   the whole `anvil tokenize` process (start, loading tokenizer.json, reading stdin,
                     encoding, printing the ids)
  anvil encode       end-to-end minus the same command on empty input (start + load)
  tokenizers encode  the Python loop [tok.encode(line).ids for line in lines] (the Python call overhead per
                     line is included: it is how the package is used without batching)

and checks that both produce identical ids for every line. Writes
bench/results/tokenizer_throughput_cpu_<date>_<commit>.json (the CPU model, date and commit inside).

Usage: python3 bench/tokenizer_bench.py [--anvil build/anvil] [--text data/shakespeare/shakespeare.txt]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchlib.results import RESULTS, git_commit, result_path, utc_now  # noqa: E402

# Runs in a subprocess so RAYON_NUM_THREADS is set before `tokenizers` is imported.
HF_SCRIPT = r"""
import json, sys, time
import tokenizers
from tokenizers import Tokenizer
tok_path, text_path, anvil_ids_path, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t0 = time.perf_counter()
tok = Tokenizer.from_file(tok_path)
load = time.perf_counter() - t0
lines = open(text_path, "rb").read().decode("utf-8").split("\n")
if lines and lines[-1] == "":
    lines.pop()
best = None
for _ in range(repeats):
    t0 = time.perf_counter()
    ids = [tok.encode(line, add_special_tokens=False).ids for line in lines]
    dt = time.perf_counter() - t0
    best = dt if best is None else min(best, dt)
anvil = [[int(x) for x in l.split()] for l in open(anvil_ids_path).read().split("\n")[:-1]]
print(json.dumps({"version": tokenizers.__version__, "load_s": load, "encode_s": best, "lines": len(lines),
                  "tokens": sum(len(i) for i in ids), "identical": anvil == ids,
                  "lines_differing": sum(a != b for a, b in zip(anvil, ids)) + abs(len(anvil) - len(ids))}))
"""


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def pinned(cmd):
    return (["taskset", "-c", "0"] if shutil.which("taskset") else []) + cmd


def time_anvil(anvil, tok, stdin_path, out_path, repeats):
    best = None
    for _ in range(repeats):
        with open(stdin_path, "rb") as fin, open(out_path, "wb") as fout:
            t0 = time.perf_counter()
            subprocess.run(pinned([anvil, "tokenize", "--tokenizer", tok]), stdin=fin, stdout=fout, check=True)
            dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anvil", default=str(ROOT / "build" / "anvil"))
    ap.add_argument("--text", default=str(ROOT / "data" / "shakespeare" / "shakespeare.txt"))
    ap.add_argument("--vocab_size", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out_dir", default=str(RESULTS))
    a = ap.parse_args()
    from tokenizers import ByteLevelBPETokenizer

    text_bytes = Path(a.text).stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        tok = f"{tmp}/bpe.json"
        bpe = ByteLevelBPETokenizer()
        bpe.train([a.text], vocab_size=a.vocab_size, special_tokens=["<|endoftext|>"], show_progress=False)
        bpe.save(tok)
        empty = f"{tmp}/empty.txt"
        Path(empty).write_bytes(b"")
        ids_path = f"{tmp}/anvil_ids.txt"
        startup = time_anvil(a.anvil, tok, empty, f"{tmp}/empty_ids.txt", a.repeats)
        total = time_anvil(a.anvil, tok, a.text, ids_path, a.repeats)
        env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        hf = json.loads(subprocess.run(pinned([sys.executable, "-c", HF_SCRIPT, tok, a.text, ids_path, str(a.repeats)]),
                                       env=env, capture_output=True, text=True, check=True).stdout)

    mb = text_bytes / 1e6
    anvil_e2e, anvil_enc, hf_enc = mb / total, mb / max(total - startup, 1e-9), mb / hf["encode_s"]
    date, (commit, _) = utc_now(), git_commit()
    result = {
        "benchmark": "tokenizer_throughput",
        "date": date.isoformat(timespec="seconds"),
        "commit": commit,
        "device": cpu_model(),
        "cores": 1,
        "text": os.path.relpath(a.text, ROOT),
        "text_bytes": text_bytes,
        "lines": hf["lines"],
        "tokens": hf["tokens"],
        "tokenizer": {"type": "byte-level BPE (ByteLevelBPETokenizer)", "vocab_size": a.vocab_size},
        "anvil": {"end_to_end_s": round(total, 4), "startup_and_load_s": round(startup, 4),
                  "end_to_end_MBps": round(anvil_e2e, 2), "encode_MBps": round(anvil_enc, 2)},
        "tokenizers": {"version": hf["version"], "encode_s": round(hf["encode_s"], 4), "encode_MBps": round(hf_enc, 2),
                       "settings": "RAYON_NUM_THREADS=1, encode() per line, no batch"},
        "ratio_encode": round(anvil_enc / hf_enc, 2),
        "ratio_end_to_end_vs_tokenizers_encode": round(anvil_e2e / hf_enc, 2),
        "identical_ids": hf["identical"],
        "lines_differing": hf["lines_differing"],
        "repeats": a.repeats,
    }
    print(f"text: {result['text']} ({mb:.2f} MB, {hf['lines']} lines, {hf['tokens']} tokens), "
          f"BPE vocab {a.vocab_size}, one core ({result['device']})")
    print(f"anvil tokenize      end-to-end {anvil_e2e:8.2f} MB/s  ({total:.3f} s, of which {startup:.3f} s start + load)")
    print(f"anvil tokenize      encode     {anvil_enc:8.2f} MB/s")
    print(f"tokenizers {hf['version']:8s} encode     {hf_enc:8.2f} MB/s  ({hf['encode_s']:.3f} s)")
    print(f"ratio (encode): {result['ratio_encode']}x; identical ids: {hf['identical']}")
    out = result_path("tokenizer_throughput", None, date, commit, directory=a.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {os.path.relpath(out, ROOT)}")
    if not hf["identical"]:
        sys.exit("ids differ between anvil and tokenizers")


if __name__ == "__main__":
    main()
