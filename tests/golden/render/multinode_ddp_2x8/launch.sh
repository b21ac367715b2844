#!/usr/bin/env bash
# Written by tuner: the launch command for a run on 2 machines.
# Start it once on every machine with that machine's rank, 0 to 1; rank 0 (10.0.0.1) hosts the
# rendezvous on port 29500:
#   machine 0: runs/multinode_ddp_2x8/launch.sh 0
#   machine 1: runs/multinode_ddp_2x8/launch.sh 1
# MAIN_PROCESS_IP=<address> replaces rank 0's address (the Slurm script sets it).
set -euo pipefail
cd "$(dirname "$0")"/../..
usage="usage: $0 MACHINE_RANK (0 to 1), once on each machine"
machine_rank="${1:?$usage}"
[[ "$machine_rank" =~ ^[0-9]+$ ]] && (( machine_rank <= 1 )) || { echo "$usage" >&2; exit 2; }
shift
main_process_ip=${MAIN_PROCESS_IP:-10.0.0.1}
tuner doctor --preflight --machine-rank "$machine_rank" runs/multinode_ddp_2x8/recipe.lock.yaml
exec accelerate launch --config_file runs/multinode_ddp_2x8/accelerate.yaml --log_dir runs/multinode_ddp_2x8/elastic --machine_rank "$machine_rank" --main_process_ip "$main_process_ip" -m tuner.train runs/multinode_ddp_2x8/recipe.lock.yaml "$@"
