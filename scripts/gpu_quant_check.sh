#!/usr/bin/env bash
# On a GPU machine: quantized weight storage (int8 / NF4, `--quantization`) on CUDA. Prints one PASS/FAIL
# line per check and exits non-zero on any failure:
#   parity: the CUDA dequantize op gives the CPU reference's bytes (int8 / NF4 into fp32, bf16, fp16), and
#     greedy generation of a quantized Llama-shaped model gives the CPU's ids
#   bitsandbytes: `anvil logits --quantization nf4` equals transformers + bitsandbytes load_in_4bit (nf4, fp32
#     compute) to fp32 GEMM rounding; int8 within the size of int8's own error (tests/golden/check_bnb_quantized.py;
#     needs the bitsandbytes package importable)
# Also prints (information) decoding tokens/s at batch 1 of the Llama-3.2-1B shape with bf16, int8 and NF4
# block matrices, and the weights' memory.
# Uses .devcarry/ when present (scripts/pack_for_gpu.sh), else the build in $ANVIL_BUILD_DIR (or build/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_quant_check}
source scripts/gpu_check_lib.sh  # build, check, failures
check parity "$build/anvil_parity_tests" --gtest_filter='*Dequantize*:*QuantizedGeneration*'
check bitsandbytes python3 tests/golden/check_bnb_quantized.py --anvil "$build/anvil"
grep "relative max difference" "$out/bitsandbytes.log"
ANVIL_BENCH_GENERATION=1 "$build/anvil_parity_tests" --gtest_filter='QuantizedGenerationSpeed.*' 2>&1 \
  | grep "tokens/s" | tee "$out/speed.log"
echo "$failures failure(s)"
exit $((failures > 0))
