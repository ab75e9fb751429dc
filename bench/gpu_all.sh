#!/usr/bin/env bash
# One device call for the lead: GPU tests, notebooks under nbval, and the bench topics, each under
# its own time limit so one slow part cannot starve the rest. Logs and JSON go to $OUT.
# Usage on the device (repo root; carry .whl for the Jupyter wheels, .mamba_ref for mamba_ssm):
#   bash bench/gpu_all.sh SECTION...    (sections: tests notebooks scans memory ssd selective step ch08)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD MAMBALEARN_PROGRESS=0 MPLBACKEND=Agg PYTHONUNBUFFERED=1
export MAMBA_SSM_PATH=$PWD/.mamba_ref/mamba_ssm-2.3.2.post1/mamba_ssm
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m mambalearn doctor | tee "$OUT/doctor.txt"
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 25 "$OUT/$name.log"
}
for s in "$@"; do
  case $s in
    tests) step tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests ;;
    notebooks) step notebooks 240 python3 -m pytest --nbval-lax --nbval-current-env -q -p no:cacheprovider \
        --durations=0 --junitxml="$OUT/notebooks.xml" notebooks solutions ;;
    scans|memory|ssd|selective_scan|step) step "bench_$s" 120 python3 -m mambalearn bench "$s" --json "$OUT/bench_$s.json" ;;
    ch08) step ch08 60 python3 .f08/gpu08.py ;;
  esac
done
