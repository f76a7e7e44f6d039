"""GPU memory in use, read through NVML exactly as the seed reads it (nvmlDeviceGetMemoryInfo(...).used).

The seed prints `nvmlDeviceGetMemoryInfo(handle).used // 1024**2` through pynvml. pynvml is a thin wrapper
over libnvidia-ml.so.1, which the driver installs, so this module calls the library directly with ctypes:
nothing to install on the GPU machine. If the library cannot be loaded it falls back to `nvidia-smi`
(slower, same counter); if neither works, `GpuMemory.available` is False and callers report "n/a".

Both systems of the benchmark are measured by this one class, from the parent process, so the numbers are
comparable by construction.
"""
import ctypes
import shutil
import subprocess

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
