#!/usr/bin/env bash
# Packs what a GPU machine without package access needs into .devcarry/ (git-ignored): the CUDA build's
# binaries, the shared libraries they use that such a machine lacks (OpenBLAS, fmt, gfortran, ...), and
# the corpus. Build first with CUDA into build-cuda (or set ANVIL_BUILD_DIR). Then, on the GPU machine,
# from the repository root: bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ANVIL_BUILD_DIR:-build-cuda}
[ -x "$build/anvil_parity_tests" ] || { echo "no CUDA build in $build (cmake -S . -B $build && cmake --build $build)" >&2; exit 1; }
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.devcarry/' >> .git/info/exclude; }
rm -rf .devcarry && mkdir -p .devcarry/bin
# Gzipped (about a quarter of their size: the device code compresses well), so that they fit the device
# tool's carry limit; scripts/gpu_env.sh unpacks them.
bins=()
for b in anvil anvil_parity_tests anvil_unit_tests; do
  [ ! -x "$build/$b" ] || { gzip -c "$build/$b" > ".devcarry/bin/$b.gz"; bins+=("$build/$b"); }
done
libs=$(mktemp -d)
trap 'rm -rf "$libs"' EXIT
mkdir -p "$libs/anvil_libs"
# Everything the binaries resolve outside glibc, libstdc++ and the CUDA libraries (present there).
ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u |
  grep -vE 'libnccl|libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libcudnn|libnvrtc|libdl|libpthread|librt' |
  while read -r lib; do cp -L "$lib" "$libs/anvil_libs/"; done
tar czf .devcarry/libs.tgz -C "$libs" anvil_libs
gzip -c data/shakespeare/shakespeare.txt > .devcarry/shakespeare.txt.gz
git rev-parse HEAD > .devcarry/commit
du -sh .devcarry
# Optional: a bitsandbytes wheel (BNB_WHEEL=path, from `pip download bitsandbytes`) for bench/optimizer_bench.py,
# stripped to the CUDA 12.8+ libraries so it fits the carry limit; on the GPU machine:
#   mkdir -p /tmp/bnb && tar xzf .devcarry/bnb.tgz -C /tmp/bnb && export PYTHONPATH=/tmp/bnb
if [ -n "${BNB_WHEEL:-}" ]; then
  bnb=$(mktemp -d)
  python3 - "$BNB_WHEEL" "$bnb" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for i in z.infolist():
    if re.search(r"libbitsandbytes_(cuda1[01]\d|cuda12[0-6]|rocm\d+)\.so$", i.filename):
        continue
    z.extract(i, sys.argv[2])
PY
  tar czf .devcarry/bnb.tgz -C "$bnb" .
  rm -rf "$bnb"
  du -sh .devcarry/bnb.tgz
fi
