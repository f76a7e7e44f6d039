"""The Anvil side of a training benchmark: `anvil train` as a child process, its GPU memory watched through
NVML by the same `Meter` as the reference (bench/benchlib/child.py), its speed read from metrics.jsonl.

Speed is measured as the reference measures it: the wall time from the end of the last warm-up step to the
end of the last step, over the tokens of the steps in between (metrics.jsonl's `elapsed` at those steps;
the script passes `--logging_steps 1`). Anvil's training loop synchronises with the device once per step to
read the loss (the reference reads its losses once, after the timed steps); that is Anvil's cost, included.
Anvil also loads its batches from the token shard on the host each step (copied on a second stream), which
the reference does not: its data sits on the device before the first step.
"""
import json
import shutil
from pathlib import Path


def command(anvil, flags, work, launch=None):
    """The command line of a run: `anvil train FLAGS --output_dir WORK/out --logging_steps 1`, or with
    `launch` (the launcher's options, e.g. ["--nproc_per_node", 2, "--master_port", 29511]) `anvil launch
    LAUNCH train ...`, whose rank 0 writes the output directory."""
    pre = ["launch", *map(str, launch)] if launch is not None else []
    return [str(anvil), *pre, "train", *map(str, flags), "--output_dir", str(Path(work) / "out"),
            "--logging_steps", "1"]


def run(anvil, flags, work, meter, warmup, timeout=600, env=None, keep_output=False, launch=None):
    """Runs `anvil train FLAGS --output_dir WORK/out --logging_steps 1` under the meter (through `anvil
    launch LAUNCH` when `launch` is given: see command()). Returns tokens_per_second and ms_per_step over the
    steps after `warmup` (a distributed run's: the whole world's tokens, as its metrics.jsonl gives them),
    the losses, Anvil's own summary (its reported peak memory among it) and `process` (wall time, NVML
    memory: process.memory.peak_mib); or `error`, with `oom` when Anvil could not fit the run on the
    device."""
    work = Path(work)
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    cmd = command(anvil, flags, work, launch)
    proc = meter.run(cmd, work / "log.txt", timeout, env=env)
    res = {"command": cmd, "process": proc}
    if proc["timed_out"]:
        res["error"] = f"timed out after {timeout} s"
    elif proc["returncode"] != 0:
        errs = [l for l in proc["log_tail"] if l.startswith("error")] or proc["log_tail"][-3:]
        res["error"] = f"exit code {proc['returncode']}: " + " | ".join(errs)
        res["oom"] = "out of memory" in res["error"].lower()
    if "error" in res:
        return res
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    rows = [r for r in rows if "loss" in r and "step" in r]
    summary = json.loads((out / "summary.json").read_text())
    start = next((r for r in rows if r["step"] == warmup), None)
    timed = [r for r in rows if r["step"] > warmup]
    if start is None or not timed:
        res["error"] = f"metrics.jsonl has no step {warmup} or none after it (steps {[r['step'] for r in rows]})"
        return res
    seconds = timed[-1]["elapsed"] - start["elapsed"]
    tokens = sum(r["tokens_per_second"] * r["step_time"] for r in timed)  # each step's tokens
    res.update(tokens_per_second=tokens / seconds, ms_per_step=1000 * seconds / len(timed),
               timed_steps=len(timed), losses=[r["loss"] for r in rows], summary=summary,
               self_reported_peak_bytes=summary.get("peak_memory_bytes"),
               driver_peak_bytes=summary.get("driver_peak_bytes"),
               planned_memory_bytes=summary.get("planned_memory_bytes"))
    if not keep_output:
        shutil.rmtree(out, ignore_errors=True)  # the final checkpoint (GBs for the larger models)
    return res
