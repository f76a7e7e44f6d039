"""Runs one measured system (an `anvil` process, a PyTorch reference, an HF Trainer row) as a child process
while the parent polls the GPU's used memory through NVML.

Every benchmark runs each side of a comparison through `Meter.run`, so both sides' memory is the same
quantity: the peak of NVML's device-wide `used` while the child lives, minus `used` just before it starts
(after the previous child's memory has been returned). That includes everything the process holds on the
device: its CUDA context, library workspaces and allocator caches, not only the tensors.
"""
import os
import signal
import subprocess
import threading
import time

from .nvml import MIB, MemoryWatch, quiet_baseline

# A device whose memory rose by less than this during a child's life is counted as not used by it.
USED_THRESHOLD_MIB = 256


class Meter:
    """One GPU (NVML index) and how it is watched: polling interval and how long to wait for the previous
    child's memory to be returned. `reference` is the memory in use when the meter was made (the idle GPU)."""

    def __init__(self, gpu, poll=0.05, settle=15.0):
        self.gpu, self.poll, self.settle = gpu, poll, settle
        self.reference = quiet_baseline(gpu, 0, None)

    def describe(self):
        """The method, for the results' JSON."""
        return {"available": self.gpu.available, "source": self.gpu.source, "error": self.gpu.error,
                "poll_seconds": self.poll,
                "peak": "peak of NVML 'used' polled by the parent while the child runs, minus 'used' just "
                        "before the child starts (the same for every system)"}

    def run(self, cmd, log_path, timeout, env=None, cwd=None, end_marker=None):
        """Runs cmd in its own session, streaming its output to log_path. Returns wall time, exit code,
        memory (peak and, when `end_marker(line)` matched a line of the output, the sample taken then; both
        minus the baseline) and the tail of the log."""
        baseline = quiet_baseline(self.gpu, self.settle, self.reference)
        watch = MemoryWatch(self.gpu, self.poll)
        watch.start()
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True, cwd=cwd)
        tail = []

        def reader():
            with open(log_path, "w") as log:
                for line in proc.stdout:
                    log.write(line)
                    tail.append(line.rstrip("\n"))
                    del tail[:-40]
                    if end_marker and end_marker(line):
                        watch.mark()

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: only what this script started
            proc.wait()
        wall = time.time() - t0  # the process's whole life: start-up, model construction, training, exit
        th.join(timeout=10)
        watch.stop()
        mem = {"baseline_used_mib": None if baseline is None else baseline / MIB,
               "peak_used_mib": None if watch.peak is None else watch.peak / MIB,
               "nvml_samples": watch.samples}
        if baseline is not None and watch.peak is not None:
            mem["peak_mib"] = (watch.peak - baseline) / MIB
        if baseline is not None and watch.marked is not None:
            mem["at_end_mib"] = (watch.marked - baseline) / MIB
            mem["at_end_used_mib"] = watch.marked / MIB
        return {"wall_seconds": wall, "returncode": proc.returncode, "timed_out": timed_out, "memory": mem,
                "log": str(log_path), "log_tail": tail[-15:]}


class MultiMeter:
    """The Meter of a multi-GPU benchmark: watches every GPU of the machine (a list of GpuMemory, one per NVML
    index) at once, so that a distributed child (`anvil launch`, torchrun and its workers) is measured on
    each GPU it uses, whichever process holds the memory. `run` has Meter.run's interface and results; its
    memory's `peak_mib` is the largest of the GPUs' peaks (each the peak of NVML 'used' on that GPU while the
    child runs, minus 'used' on it just before), and `per_gpu` lists every GPU's figures.

    On a timeout the child's process group gets SIGTERM (torchrun and `anvil launch` pass it on to their
    workers and stop them), then SIGKILL after `term_grace` seconds; `kill_also` (a callable returning PIDs)
    names further processes the child started in sessions of their own (torchrun's workers), which then get
    SIGKILL if they are still alive."""

    def __init__(self, gpus, poll=0.05, settle=15.0, term_grace=15.0):
        self.gpus, self.poll, self.settle, self.term_grace = list(gpus), poll, settle, term_grace
        assert self.gpus, "MultiMeter needs at least one GPU"
        self.gpu = self.gpus[0]  # as Meter's: name, driver, availability of the machine's first GPU
        self.reference = [quiet_baseline(g, 0, None) for g in self.gpus]

    def describe(self):
        return {"available": self.gpu.available, "source": self.gpu.source, "error": self.gpu.error,
                "poll_seconds": self.poll, "gpus_watched": [g.index for g in self.gpus],
                "peak": "per GPU: peak of NVML 'used' polled by the parent while the child runs, minus 'used' "
                        "on that GPU just before the child starts; the figure per GPU is the largest over the "
                        "machine's GPUs (the same for every system)"}

    def _baselines(self):
        """Every GPU's used memory with no child running, waiting (up to `settle` seconds in all) for the
        previous child's memory to be returned on each."""
        deadline = time.time() + self.settle
        out = []
        for g, ref in zip(self.gpus, self.reference):
            out.append(quiet_baseline(g, max(0.0, deadline - time.time()), ref))
        return out

    def run(self, cmd, log_path, timeout, env=None, cwd=None, end_marker=None, kill_also=None):
        baselines = self._baselines()
        watches = [MemoryWatch(g, self.poll) for g in self.gpus]
        for w in watches:
            w.start()
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True, cwd=cwd)
        tail = []

        def reader():
            with open(log_path, "w") as log:
                for line in proc.stdout:
                    log.write(line)
                    tail.append(line.rstrip("\n"))
                    del tail[:-60]
                    if end_marker and end_marker(line):
                        for w in watches:
                            w.mark()

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(proc.pid, signal.SIGTERM)  # the child's own session: only what this script started
            try:
                proc.wait(timeout=self.term_grace)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.time() - t0
        if kill_also:  # workers in sessions of their own that outlived their launcher
            for pid in kill_also():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        th.join(timeout=10)
        for w in watches:
            w.stop()
        per_gpu = []
        for g, base, w in zip(self.gpus, baselines, watches):
            e = {"index": g.index, "baseline_used_mib": None if base is None else base / MIB,
                 "peak_used_mib": None if w.peak is None else w.peak / MIB, "nvml_samples": w.samples}
            if base is not None and w.peak is not None:
                e["peak_mib"] = (w.peak - base) / MIB
            if base is not None and w.marked is not None:
                e["at_end_mib"] = (w.marked - base) / MIB
            per_gpu.append(e)
        peaks = [e["peak_mib"] for e in per_gpu if "peak_mib" in e]
        mem = {"per_gpu": per_gpu,
               "gpus_used": [e["index"] for e in per_gpu if e.get("peak_mib", 0) >= USED_THRESHOLD_MIB]}
        if peaks:
            mem["peak_mib"] = max(peaks)
        return {"wall_seconds": wall, "returncode": proc.returncode, "timed_out": timed_out, "memory": mem,
                "log": str(log_path), "log_tail": tail[-25:]}


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
