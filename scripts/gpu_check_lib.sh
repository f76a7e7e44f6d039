# Sourced by the GPU check scripts (gpu_quant_check.sh, gpu_lora_check.sh) from the repository root, with
# `out` set to their log folder: sets up the carried build (scripts/gpu_env.sh), `build` (build-cuda when
# .devcarry/ was carried, else $ANVIL_BUILD_DIR or build/), and `check NAME COMMAND...`, which runs the command
# with its output in $out/NAME.log, prints PASS or FAIL (with the log's tail) and counts `failures`.
mkdir -p "$out"
source scripts/gpu_env.sh
build=${ANVIL_BUILD_DIR:-build}
[ -d .devcarry/bin ] && build=build-cuda
failures=0
check() {
  local name=$1; shift
  if "$@" > "$out/$name.log" 2>&1; then
    echo "PASS $name"
  else
    echo "FAIL $name (log: $out/$name.log)"; tail -15 "$out/$name.log"; failures=$((failures + 1))
  fi
}
