#!/usr/bin/env bash
# GPU smoke test of the real launch path on one NVIDIA GPU: FSDP2 (one rank) and QLoRA in bf16 through
# `tuner run`, printing the planner's prediction next to the measured peak, and `tuner probe` of the demo (CUDA
# allocated / reserved / device per phase beside the plan; probe.json kept). Usage: bash benchmarks/gpu_smoke.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/tuner-gpu-smoke}}"; mkdir -p "$out"
export TUNER_HOME="${TUNER_HOME:-/tmp/tuner-home}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
py="${PYTHON:-python3}"
gpu=(--set hardware.gpus_per_machine=1 --set hardware.gpu=H200 --set memory.mixed_precision=bf16)
run() {  # name recipe overrides...
  local name=$1 recipe=$2; shift 2
  local dir="/tmp/tuner-smoke-runs/$name"; rm -rf "$dir"
  local start=$SECONDS
  "$py" -m tuner run "$recipe" "${gpu[@]}" --set output.dir="$dir" "$@" > "$out/$name.log" 2>&1
  local code=$?
  echo "== $name: exit $code in $((SECONDS - start)) s"
  grep -E "attention:|plan predicted|trainable parameters" "$dir/train.log" | head -5
  cp "$dir/memory.json" "$out/$name.memory.json" 2>/dev/null && cat "$out/$name.memory.json"; echo
  tail -3 "$out/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run fsdp demo --set memory.distributed=fsdp --set training.max_steps=60 --set training.logging_steps=20
run qlora demo-qlora --set training.max_steps=30 --set training.logging_steps=10
probe_dir=/tmp/tuner-smoke-runs/probe; rm -rf "$probe_dir"; start=$SECONDS
"$py" -m tuner probe demo "${gpu[@]}" --set output.dir="$probe_dir" > "$out/probe.log" 2>&1
echo "== probe: exit $? in $((SECONDS - start)) s"; tail -25 "$out/probe.log"
cp "$probe_dir/probe/probe.json" "$out/probe.json" 2>/dev/null
