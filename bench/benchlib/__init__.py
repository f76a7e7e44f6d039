"""Code shared by the benchmarks in bench/ (bench/README.md):

- torch_reference: the PyTorch / Hugging Face reference side, written once for every benchmark
- torch_distributed_reference: the same reference on several GPUs (DDP, FSDP2) under torchrun
- anvil_train: the Anvil side of a training benchmark (`anvil train` as a measured child)
- child, nvml: running a system as a child process while NVML watches its GPU memory, the same for both sides
  (MultiMeter: every GPU of the machine, for distributed children)
- results: result file names (benchmark, device, date, commit) and the commit being measured
- shards: Anvil token shards (reading, writing random ones)
"""
