"""Where benchmark results go and what they are named after: the benchmark, the device, the date and the
commit, e.g. bench/results/gpt2_speed_h100_2026-11-26_38a4e3a.json."""
import datetime
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"

# Short names of the GPUs the project runs on, looked for in the NVML / nvidia-smi device name.
_KNOWN_DEVICES = ("h200", "h100", "a100", "l40s", "l4")


def git_commit():
    """(commit, where it came from): $ANVIL_COMMIT (scripts/gpu_env.sh exports it from .devcarry/commit), else
    .devcarry/commit (scripts/pack_for_gpu.sh), else `git rev-parse HEAD` of the tree, noting uncommitted
    changes; "unknown" when none of them is there (a copy of the tree without history)."""
    if os.environ.get("ANVIL_COMMIT"):
        return os.environ["ANVIL_COMMIT"], "$ANVIL_COMMIT"
    carried = REPO / ".devcarry" / "commit"
    if carried.exists():
        return carried.read_text().strip(), ".devcarry/commit"
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(REPO), capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(REPO),
                               capture_output=True, text=True).stdout.strip()
        if r.returncode == 0:
            return r.stdout.strip(), "git rev-parse HEAD" + (" (uncommitted changes in the tree)" if dirty else "")
    except OSError:
        pass
    return "unknown", "no $ANVIL_COMMIT, no .devcarry/commit, no git"


def device_slug(name):
    """A device name as it appears in result file names: h100, h200, ... for known GPUs, else the name in
    lower case with runs of other characters as '_'; "cpu" when there is no GPU name."""
    if not name:
        return "cpu"
    low = name.lower()
    known = next((k for k in _KNOWN_DEVICES if k in low), None)
    return known or re.sub(r"[^a-z0-9]+", "_", low).strip("_")


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def result_path(benchmark, device_name, date, commit, suffix=".json", directory=RESULTS):
    """bench/results/<benchmark>_<device>_<YYYY-MM-DD>_<commit, 7 characters><suffix>. `date` is a datetime
    or an ISO date string."""
    day = date if isinstance(date, str) else date.date().isoformat()
    short = commit[:7] if commit and commit != "unknown" else "unknown"
    return Path(directory) / f"{benchmark}_{device_slug(device_name)}_{day[:10]}_{short}{suffix}"
