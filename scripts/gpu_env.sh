#!/usr/bin/env bash
# Source on a GPU machine from the repository root: installs the binaries and libraries packed by
# scripts/pack_for_gpu.sh (.devcarry/) into build-cuda/ and sets LD_LIBRARY_PATH so they find them, cuDNN
# (the pip package nvidia-cudnn, e.g. PyTorch's) and the CUDA toolkit's NVRTC.
if [ -d .devcarry/bin ]; then
  mkdir -p build-cuda
  for f in .devcarry/bin/*.gz; do  # gzipped by pack_for_gpu.sh
    [ -e "$f" ] || continue
    b=build-cuda/$(basename "$f" .gz)
    gunzip -c "$f" > "$b" && chmod +x "$b"
  done
  tar xzf .devcarry/libs.tgz -C /tmp
  export ANVIL_COMMIT=$(cat .devcarry/commit)
  mkdir -p data/shakespeare
  [ -s data/shakespeare/shakespeare.txt ] || gunzip -c .devcarry/shakespeare.txt.gz > data/shakespeare/shakespeare.txt
  # The test binaries look for the sources where they were built.
  [ -e /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
fi
cudnn_lib=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null || true)
# NCCL: the toolkit's, else the pip package nvidia-nccl (PyTorch's); not carried (200+ MB).
nccl_lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null || true)
for d in "$nccl_lib" /usr/local/cuda/lib /usr/local/cuda/lib64 "$cudnn_lib" /tmp/anvil_libs; do  # the first listed ends last
  [ -n "$d" ] && [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
