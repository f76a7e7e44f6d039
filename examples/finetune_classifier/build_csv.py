#!/usr/bin/env python3
"""Builds the labelled CSV of the fortune-topic task from Debian's fortune files.

Each cookie of a fortune file (records separated by lines holding only "%") becomes one row,
labelled with the name of the file it comes from (its topic). Whitespace is collapsed to single
spaces and terminal overstriking ("_\\bx") is removed. Cookies longer than --max_chars characters are
left out (keeps the sequences short for a CPU run), and so is any text found in more than one of the
chosen files (its label would be ambiguous); a text repeated within one file is kept once.

Rows are written in a fixed order (by topic, then file order), so the CSV is byte-identical on every
run; `anvil prepare-data --val_fraction F --seed S` then makes the deterministic train/validation split.

Usage: build_csv.py FORTUNES_DIR OUT.csv [--topics a,b,c] [--max_chars 400]
"""
import argparse
import csv
import os
import re
import sys
from collections import Counter

DEFAULT_TOPICS = "art,computers,education,food,law,medicine,politics,science,sports"


def cookies(path):
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8", errors="replace")
    raw = raw.replace("\r\n", "\n")
    record = []
    for line in raw.split("\n"):
        if line == "%":
            yield "\n".join(record)
            record = []
        else:
            record.append(line)
    if any(l.strip() for l in record):
        yield "\n".join(record)


def clean(text):
    while True:  # overstriking: "c\bc" (bold) or "_\bc" (underline) -> "c"
        new = re.sub(r"[^\x08]\x08", "", text)
        if new == text:
            break
        text = new
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    return " ".join(text.split())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fortunes_dir")
    ap.add_argument("out_csv")
    ap.add_argument("--topics", default=DEFAULT_TOPICS)
    ap.add_argument("--max_chars", type=int, default=400)
    args = ap.parse_args()

    topics = [t for t in args.topics.split(",") if t]
    per_topic = {}
    for topic in topics:
        path = os.path.join(args.fortunes_dir, topic)
        if not os.path.isfile(path):
            sys.exit(f"error: no fortune file {path}")
        seen, texts = set(), []
        for c in cookies(path):
            t = clean(c)
            if t and len(t) <= args.max_chars and t not in seen:
                seen.add(t)
                texts.append(t)
        per_topic[topic] = texts

    occurrences = Counter(t for texts in per_topic.values() for t in texts)
    rows = [(t, topic) for topic in topics for t in per_topic[topic] if occurrences[t] == 1]
    ambiguous = sum(1 for n in occurrences.values() if n > 1)

    os.makedirs(os.path.dirname(os.path.abspath(args.out_csv)), exist_ok=True)
    tmp = args.out_csv + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["text", "label"])
        w.writerows(rows)
    os.replace(tmp, args.out_csv)

    counts = Counter(label for _, label in rows)
    print(f"{args.out_csv}: {len(rows)} examples, {len(topics)} topics "
          f"({', '.join(f'{t} {counts[t]}' for t in topics)}); "
          f"{ambiguous} texts found in several topics left out")


if __name__ == "__main__":
    main()
