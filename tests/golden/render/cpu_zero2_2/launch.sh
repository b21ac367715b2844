#!/usr/bin/env bash
# Written by tuner: the exact command `tuner run` launches.
set -euo pipefail
cd "$(dirname "$0")"/../..
accelerate launch --config_file runs/cpu_zero2_2/accelerate.yaml --log_dir runs/cpu_zero2_2/elastic -m tuner.train runs/cpu_zero2_2/recipe.lock.yaml "$@"
