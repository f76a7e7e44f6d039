"""GPU memory in use, read through NVML exactly as the seed reads it (nvmlDeviceGetMemoryInfo(...).used),
and a watch that polls it while a child process runs.

The seed prints `nvmlDeviceGetMemoryInfo(handle).used // 1024**2` through pynvml. pynvml is a thin wrapper
over libnvidia-ml.so.1, which the driver installs, so this module calls the library directly with ctypes:
nothing to install on the GPU machine. If the library cannot be loaded it falls back to `nvidia-smi`
(slower, same counter); if neither works, `GpuMemory.available` is False and callers report "n/a".

Every benchmark measures both systems with this one class, from the parent process (bench/benchlib/child.py),
so the numbers are comparable by construction.
"""
import ctypes
import shutil
import subprocess
import threading
import time

MIB = 1024 * 1024


class _MemoryInfo(ctypes.Structure):
    # nvmlMemory_t (version 1, the one pynvml's nvmlDeviceGetMemoryInfo uses by default): bytes.
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class GpuMemory:
    """Used memory of one GPU (NVML index), in bytes. `source` says how it is read."""

    def __init__(self, index=0):
        self.index = index
        self.available = False
        self.source = "none"
        self.error = ""
        self._lib = None
        self._handle = None
        try:
            self._init_ctypes()
            self.available, self.source = True, "NVML (libnvidia-ml.so.1 via ctypes)"
            return
        except OSError as e:  # no driver library, or an NVML call failed
            self.error = f"NVML: {e}"
        if shutil.which("nvidia-smi"):
            try:
                self._smi("memory.used")
                self.available, self.source = True, "nvidia-smi --query-gpu=memory.used"
                return
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                self.error += f"; nvidia-smi: {e}"

    # -- NVML through ctypes -------------------------------------------------------------------------
    def _check(self, ret, what):
        if ret != 0:
            self._lib.nvmlErrorString.restype = ctypes.c_char_p
            raise OSError(f"{what} failed: {self._lib.nvmlErrorString(ret).decode()} ({ret})")

    def _init_ctypes(self):
        self._lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self._lib.nvmlInit_v2(), "nvmlInit_v2")
        handle = ctypes.c_void_p()
        self._check(self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(self.index), ctypes.byref(handle)),
                    f"nvmlDeviceGetHandleByIndex_v2({self.index})")
        self._handle = handle
        self.used_bytes()  # fail now rather than in the sampling thread

    def _smi(self, field):
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits",
                              "-i", str(self.index)], capture_output=True, text=True, timeout=20, check=True)
        return out.stdout.strip().splitlines()[0].strip()

    # -- queries -------------------------------------------------------------------------------------
    def used_bytes(self):
        """Bytes in use on the GPU (all processes), or None when no reader works."""
        if self._handle is not None:
            info = _MemoryInfo()
            self._check(self._lib.nvmlDeviceGetMemoryInfo(self._handle, ctypes.byref(info)),
                        "nvmlDeviceGetMemoryInfo")
            return int(info.used)
        if self.available:  # nvidia-smi reports MiB
            return int(self._smi("memory.used")) * MIB
        return None

    def total_bytes(self):
        if self._handle is not None:
            info = _MemoryInfo()
            self._check(self._lib.nvmlDeviceGetMemoryInfo(self._handle, ctypes.byref(info)),
                        "nvmlDeviceGetMemoryInfo")
            return int(info.total)
        if self.available:
            return int(self._smi("memory.total")) * MIB
        return None

    def name(self):
        if self._handle is not None:
            buf = ctypes.create_string_buffer(96)
            self._check(self._lib.nvmlDeviceGetName(self._handle, buf, ctypes.c_uint(len(buf))), "nvmlDeviceGetName")
            return buf.value.decode()
        if self.available:
            return self._smi("name")
        return None

    def driver_version(self):
        if self._handle is not None:
            buf = ctypes.create_string_buffer(96)
            if self._lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf))) == 0:
                return buf.value.decode()
            return None
        if self.available:
            return self._smi("driver_version")
        return None


class MemoryWatch:
    """Polls the GPU's used memory every `interval` seconds in a thread while a child runs: the peak, and a
    sample taken on request (when the child reports that training ended)."""

    def __init__(self, gpu, interval):
        self.gpu, self.interval = gpu, interval
        self.peak = None
        self.samples = 0
        self.marked = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None

    def _record(self):
        used = self.gpu.used_bytes()
        with self._lock:
            self.samples += 1
            self.peak = used if self.peak is None else max(self.peak, used)
        return used

    def start(self):
        if self.gpu.available:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            self._record()
            self._stop.wait(self.interval)

    def mark(self):
        if self.gpu.available:
            self.marked = self._record()

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join()
            self._record()


def gpu_count():
    """The number of GPUs NVML sees on this machine (all of them, whatever CUDA_VISIBLE_DEVICES says), else
    the lines of `nvidia-smi -L`; 0 when neither works."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() == 0:
            n = ctypes.c_uint()
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0:
                return int(n.value)
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=True)
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            pass
    return 0


def quiet_baseline(gpu, settle_s, reference):
    """Used memory with no child running: waits (up to settle_s) for the previous child's memory to be
    returned, then takes the lowest of a few samples."""
    if not gpu.available:
        return None
    deadline = time.time() + settle_s
    while time.time() < deadline and reference is not None and gpu.used_bytes() > reference + 64 * MIB:
        time.sleep(0.2)
    vals = []
    for _ in range(5):
        vals.append(gpu.used_bytes())
        time.sleep(0.05)
    return min(vals)
