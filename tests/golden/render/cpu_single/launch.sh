#!/usr/bin/env bash
# Written by tuner: the exact command `tuner run` launches.
set -euo pipefail
cd "$(dirname "$0")"/../..
accelerate launch --config_file runs/cpu_single/accelerate.yaml --log_dir runs/cpu_single/elastic -m tuner.train runs/cpu_single/recipe.lock.yaml "$@"
