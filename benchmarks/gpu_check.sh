#!/usr/bin/env bash
# Reproduce the GPU evidence: bash benchmarks/gpu_check.sh [--quick | --report FILE]  (see benchmarks/gpu_check.py)
cd "$(dirname "$0")/.." && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m benchmarks.gpu_check "$@"
