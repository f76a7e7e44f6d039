"""Code shared by the benchmarks in bench/ (bench/README.md):

- torch_reference: the PyTorch / Hugging Face reference side, written once for every benchmark
- anvil_train: the Anvil side of a training benchmark (`anvil train` as a measured child)
- child, nvml: running a system as a child process while NVML watches its GPU memory, the same for both sides
- results: result file names (benchmark, device, date, commit) and the commit being measured
- shards: Anvil token shards (reading, writing random ones)
"""
