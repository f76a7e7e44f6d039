#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) into build-fuzz/ with clang and runs each one for a bounded
# time on a scratch copy of its seed corpus. Exits 1 when a target finds a crash, leak, UB, timeout or
# out-of-memory (the reproducer is kept under build-fuzz/artifacts/ and its path printed), 0 otherwise;
# also 0, with a message, when clang++ or libFuzzer is not installed (Debian: clang, libclang-rt-dev).
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 20)] [TARGET...]
# Replay a reproducer: build-fuzz/fuzz_<name> build-fuzz/artifacts/fuzz_<name>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
[ $# -gt 0 ] && shift
# Per target: the largest input the fuzzer generates (seeds are smaller).
declare -A max_len=(
  [fuzz_safetensors]=4096 [fuzz_tokenizer_json]=8192 [fuzz_tokenizer_encode]=2048
  [fuzz_token_shard]=1024 [fuzz_classification_shard]=1024 [fuzz_csv_jsonl]=4096
  [fuzz_train_config]=4096 [fuzz_train_flags]=1024 [fuzz_trainer_state]=4096
)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_safetensors fuzz_tokenizer_json fuzz_tokenizer_encode fuzz_token_shard
                                     fuzz_classification_shard fuzz_csv_jsonl fuzz_train_config fuzz_train_flags
                                     fuzz_trainer_state)

cxx="${FUZZ_CXX:-}"
if [ -z "$cxx" ]; then
  for c in clang++ clang++-14 clang++-15 clang++-16 clang++-17 clang++-18; do
    if command -v "$c" >/dev/null; then cxx="$c" && break; fi
  done
fi
if [ -z "$cxx" ]; then
  echo "fuzz: SKIPPED: clang++ not found (install clang and its libFuzzer runtime to fuzz)"
  exit 0
fi

scratch="$(mktemp -d "$( [ -w /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/anvil_fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
# libFuzzer ships as a clang runtime library that distributions package separately: probe for it.
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$scratch/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$scratch/probe.cpp" -o "$scratch/probe" 2>/dev/null; then
  echo "fuzz: SKIPPED: $cxx cannot link -fsanitize=fuzzer,address,undefined (libFuzzer runtime missing;" \
       "Debian: libclang-rt-<version>-dev)"
  exit 0
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  cmake -S tests/fuzz -B build-fuzz "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
fi
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"

failed=()
for t in "${targets[@]}"; do
  corpus="$scratch/corpus/$t"
  artifacts="build-fuzz/artifacts/$t"
  mkdir -p "$corpus" "$artifacts" "$scratch/tmp/$t"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  log="$scratch/$t.log"
  status=0
  # Files the targets write go to tmpfs ($TMPDIR); leaks are findings (ASan's LeakSanitizer is on).
  TMPDIR="$scratch/tmp/$t" "./build-fuzz/$t" "$corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=5 \
    -rss_limit_mb=2048 -max_len="${max_len[$t]:-4096}" -artifact_prefix="$artifacts/" -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  if [ "$status" -eq 0 ]; then
    echo "fuzz: $t: OK, ${runs:-?} executions in ${seconds}s"
  else
    failed+=("$t")
    echo "fuzz: $t: FAILED (exit $status) after ${runs:-?} executions; the end of its log:"
    tail -n 60 "$log" | sed 's/^/    /'
    reproducer="$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | sed 's/Test unit written to //')"
    echo "fuzz: $t: reproducer: ${reproducer:-see $artifacts/} (replay: ./build-fuzz/$t ${reproducer:-FILE})"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets passed (${seconds}s each)"
