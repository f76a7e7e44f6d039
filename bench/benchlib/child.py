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
