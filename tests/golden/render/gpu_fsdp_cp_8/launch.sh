#!/usr/bin/env bash
# Written by tuner: the exact command `tuner run` launches.
set -euo pipefail
cd "$(dirname "$0")"/../..
accelerate launch --config_file runs/gpu_fsdp_cp_8/accelerate.yaml --log_dir runs/gpu_fsdp_cp_8/elastic -m tuner.train runs/gpu_fsdp_cp_8/recipe.lock.yaml "$@"
