#!/usr/bin/env bash
# The lead's device runs: GPU tests, notebooks under nbval, and the bench topics, each under its own
# time limit so one slow part cannot starve the rest; logs and JSON go to $OUT/run/.
# Usage on the device, from the repo root (carry .whl for the Jupyter wheels, .mamba_ref for mamba_ssm):
#   bash bench/gpu/all.sh final | final2 | final3 | final4   # the calls BENCHMARKS.md records
#   bash bench/gpu/all.sh SECTION... # prep build tests notebooks executed selective scans ssd
#                                    # ssd_steps ssd_acc ssd_fused memory step model
#                                    # profile (WL=workloads) wait_build experiments (SET=…) pack
set -u
OUT=${OUT:-/tmp/out}; LOG=$OUT/run; mkdir -p "$LOG"
export PYTHONPATH=/tmp/site:$PWD MAMBALEARN_PROGRESS=0 MPLBACKEND=Agg PYTHONUNBUFFERED=1
export MAMBA_SSM_PATH=$PWD/.mamba_ref/mamba_ssm-2.3.2.post1/mamba_ssm
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $LOG/NAME.log, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$LOG/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n "${TAIL:-30}" "$LOG/$name.log" | cut -c1-220
}
section() {
  case $1 in
    prep)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl > "$LOG/pip.log" 2>&1 || echo "wheel install failed"
      nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
      python3 -m mambalearn doctor ;;
    build)  # mamba_ssm's CUDA selective scan, sm_90 only, in the background (CPU work)
      python3 - <<'PY'
import os, runpy, subprocess, sys
g = runpy.run_path("bench/gpu/selective_scan.py", run_name="build_only")
subprocess.Popen([sys.executable, "-c", g["BUILD"], g["SRC"]], start_new_session=True,
                 env=dict(os.environ, MAX_JOBS="10", TORCH_CUDA_ARCH_LIST="9.0"),
                 stdout=open(os.environ["OUT"] + "/run/build.log", "w"), stderr=subprocess.STDOUT)
PY
      ;;
    tests) step tests "${TLIMIT:-260}" python3 -m pytest -m gpu -v -p no:cacheprovider -n 6 --dist load \
        --durations=15 tests ;;
    notebooks) step notebooks "${TLIMIT:-260}" python3 -m pytest --nbval-lax --nbval-current-env \
        -q -p no:cacheprovider -n 4 --dist loadfile --durations=0 --junitxml="$LOG/notebooks.xml" \
        ${NBV:-notebooks/0*.ipynb notebooks/12*.ipynb solutions} ;;
    executed)  # the notebooks whose outputs we read (tables, figures), kept with their outputs
      step executed 270 env -u MPLBACKEND python3 bench/gpu/run_notebook.py "$LOG" ${NBS:-notebooks/1[013]*.ipynb} ;;
    ssd_steps) step ssd_steps 70 python3 -c "from course.bench import ssd, table; print(table(ssd.backward_steps(True)))" ;;
    ssd_acc) step ssd_acc 60 python3 -c "from course.bench import ssd
ssd.run(True, shapes=[dict(b=4, l=4096, **ssd.HEADS)], forward=False)" ;;
    ssd_fused) step ssd_fused 130 python3 bench/gpu/ssd_fused.py --limit 110 --json "$LOG/ssd_fused.json" ;;
    selective) step selective 200 python3 bench/gpu/selective_scan.py --stage final --limit 195 ;;
    scans|memory|ssd|step|model) step "bench_$1" "${LIMIT:-60}" python3 -m mambalearn bench "$1" \
        --json "$LOG/bench_$1.json" ;;
    profile) step "profile_${WL// /_}" "${PLIMIT:-240}" python3 bench/gpu/profile.py ncu "$LOG/profile" $WL ;;
    experiments) step experiments "${ELIMIT:-200}" python3 bench/gpu/experiments.py \
        --set "${SET:-registers}" --limit "${ELIMIT:-200}" --json "$LOG/experiments.json" ;;
    wait_build)  # until the background build has left its .so (or the limit)
      for _ in $(seq 1 "${BLIMIT:-120}"); do
        ls /tmp/ssbuild/selective_scan_cuda*.so >/dev/null 2>&1 && ! ls /tmp/ssbuild/lock \
          >/dev/null 2>&1 && break; sleep 1; done
      mkdir -p .mamba_ref/build && cp /tmp/ssbuild/selective_scan_cuda*.so .mamba_ref/build/ \
        2>/dev/null && cp .mamba_ref/build/selective_scan_cuda*.so "$OUT/"; tail -3 "$LOG/build.log" ;;
    pack)  # at most 8 files come back: one archive
      mv "$OUT"/*.json "$OUT"/*.png "$LOG"/ 2>/dev/null
      tar czf "$OUT/results.tgz" -C "$OUT" run && rm -rf "$LOG" ;;
    final)  # three calls of < 10 min each: final, final2, final3
      section prep; section build
      section tests & section notebooks & section executed & wait  # correctness ‖ nvcc build
      section selective                                            # timing: one at a time
      LIMIT=60 section model; section pack ;;
    final2)  # SSD (chapters 10-11) and memory (05-07) topics (no CUDA build needed)
      section prep; NBS="notebooks/10_ssd.ipynb notebooks/11_fusing_ssd.ipynb" section executed
      LIMIT=170 section ssd; section ssd_steps; section ssd_fused
      LIMIT=150 section memory; section pack ;;
    final4)  # the changes since calls 1-3 checked, the PyTorch scans (chapter 04) timed
      section prep; export TAIL=14; section ssd_acc
      export TLIMIT=110 NBV="notebooks/04*.ipynb notebooks/09*.ipynb notebooks/10*.ipynb \
        solutions/04*.ipynb solutions/09*.ipynb solutions/10*.ipynb"
      section tests & section notebooks & wait
      LIMIT=60 section scans
      step selective 100 python3 bench/gpu/selective_scan.py --stage final --defaults --limit 100
      section pack ;;
    profile1|profile2)  # 2026-11-30, session 2, calls 1 and 2: ncu profiles of ours and mamba_ssm's,
      # then the experiment set of that call (`first`, then `registers` with the new defaults)
      if [ "$1" = profile1 ]; then export SET=first; else export SET=registers; fi
      section prep; section build
      WL="m1_16 m1_64 ssd ssdref" PLIMIT=260 section profile
      section wait_build; ELIMIT=160 section experiments
      WL="m1cuda_16 m1cuda_64" PLIMIT=80 section profile; section pack ;;
    ssd_sweep)  # call 3: the backward's steps and launch settings (b4 l4096), the new state passing
      section prep; step ssd_gpu_tests 120 python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/test_ssd_backward.py
      step ssd_sweep 300 python3 -m course.bench.ssd --backward --sweep; section pack ;;
    final5)  # call 4: everything changed in session 2 checked and timed with the chosen defaults
      section prep; section build
      # (chapter 11 has no solutions notebook: a glob that matches nothing made pytest collect
      # nothing in call 4, rc 5; the notebooks then ran alone, see BENCHMARKS.md)
      export TLIMIT=240 NBV="notebooks/08*.ipynb notebooks/09*.ipynb notebooks/10*.ipynb \
        notebooks/11*.ipynb solutions/08*.ipynb solutions/09*.ipynb solutions/10*.ipynb"
      section tests & section notebooks & wait
      BLIMIT=150 section wait_build
      SET=defaults ELIMIT=105 section experiments
      LIMIT=230 section ssd; section pack ;;
    session3)  # 2026-12-01, the lead's one call after the helpers' merges: every GPU test and the
      # chapters with new material under nbval (correctness, side by side), then the device
      # scripts of chapters 15, 05/12 and 14, one at a time (timing)
      section prep; export TAIL=${TAIL:-16}
      TLIMIT=${TLIMIT:-230} section tests &
      NBV="notebooks/05*.ipynb notebooks/08*.ipynb notebooks/10*.ipynb notebooks/12*.ipynb \
        notebooks/15*.ipynb solutions/05*.ipynb solutions/15*.ipynb" TLIMIT=${TLIMIT:-230} \
        section notebooks &
      wait
      step mamba3 85 python3 -m bench.gpu.mamba3 --limit 75 --json "$LOG/mamba3.json"
      step attention 100 python3 bench/gpu/attention.py "$LOG" --budget 85
      step parallel 75 python3 bench/gpu/parallel.py "$LOG"
      section pack ;;
    session3b)  # 2026-12-01, the lead's second call: the Mamba-3 fp32 build fixed (its GPU tests,
      # chapter 15 under nbval, the device script again), the Blelloch summary scan re-timed, and
      # the decode step's tiles (chapter 12, issue 20)
      section prep; export TAIL=${TAIL:-14}
      step mamba3_tests 110 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_mamba3_triton.py
      NBV="notebooks/15*.ipynb solutions/15*.ipynb" TLIMIT=95 section notebooks
      step mamba3 85 python3 -m bench.gpu.mamba3 --limit 75 --json "$LOG/mamba3.json"
      step parallel 40 python3 bench/gpu/parallel.py "$LOG"
      step ssd_step 80 python3 -m bench.gpu.ssd_fused --sections step --limit 70 \
        --json "$LOG/ssd_step.json"
      section pack ;;
    session3c)  # 2026-12-01, the lead's third call: chapter 15's kernel cell on the GPU's tensors,
      # the decode step's new small-batch tile, the SSD at b16 l1024 (not reached before)
      section prep; export TAIL=${TAIL:-14}
      step step_tests 50 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_step.py
      NBV="notebooks/15*.ipynb" TLIMIT=60 section notebooks
      step ssd_step 45 python3 -m bench.gpu.ssd_fused --sections step --limit 40 \
        --json "$LOG/ssd_step.json"
      step ssd_b16 110 python3 -c "from course.bench import ssd, table
print(table(ssd.run(True, shapes=[dict(b=16, l=1024, **ssd.HEADS)])))"
      section pack ;;
    session4)  # 2026-12-01, the lead's fourth session, call 1: every GPU test, chapters 05, 14, 15
      # and their solutions under nbval, then (timing, one at a time) the Mamba-1 rows with the
      # prefetching forward against CUDA, and the SSD fwd+bwd at b16 l1024 (not reached before)
      section prep; section build; export TAIL=${TAIL:-16}
      TLIMIT=${TLIMIT:-200} section tests &
      NBV="notebooks/05*.ipynb notebooks/14*.ipynb notebooks/15*.ipynb solutions/05*.ipynb \
        solutions/14*.ipynb solutions/15*.ipynb" TLIMIT=${TLIMIT:-200} section notebooks &
      wait
      step selective 150 python3 -m bench.gpu.selective_scan --limit 140
      step ssd_b16_bwd 100 python3 -c "from course.bench import ssd, table
print(table(ssd.run(True, shapes=[dict(b=16, l=1024, **ssd.HEADS)], forward=False)))"
      section pack ;;
    session4b)  # call 2: chapter 14 under nbval with fresh rank processes (spawn fix), the
      # parallel tests on a GPU machine, the SSD fwd+bwd at b16 l1024 (ours and mamba_ssm only)
      section prep; export TAIL=${TAIL:-14}
      NBV="notebooks/14*.ipynb solutions/14*.ipynb" TLIMIT=170 section notebooks &
      step parallel_tests 170 python3 -m pytest -q -p no:cacheprovider tests/test_parallel_block.py \
        tests/test_parallel.py tests/test_parallel_triton.py
      wait
      step ssd_b16_bwd 100 python3 -c "from course.bench import ssd, table
s = dict(b=16, l=1024, **ssd.HEADS); args, kw = ssd.make_inputs(**s, dtype=ssd.torch.bfloat16)
print(table(ssd._fwd_bwd_rows(args, kw, 256, ssd.shape_name(**s, q=256,
    dtype=ssd.torch.bfloat16), ssd.load_mamba_ssm_ssd(), oracle=False)))"
      section pack ;;
    session4c)  # call 3, after helper ssd2's merge and the fused default: every GPU test, the
      # parallel tests (fresh rank processes), chapters 10/11/14 under nbval, then the SSD topic
      # (forward and fwd+bwd, all three shapes, the new default against mamba_ssm and FLA)
      section prep; export TAIL=${TAIL:-16}
      TLIMIT=200 section tests &
      step parallel_tests 200 python3 -m pytest -q -p no:cacheprovider -n 4 \
        tests/test_parallel_block.py tests/test_parallel.py &
      NBV="notebooks/10*.ipynb notebooks/11*.ipynb notebooks/14*.ipynb solutions/10*.ipynb \
        solutions/14*.ipynb" TLIMIT=200 section notebooks &
      wait
      LIMIT=260 section ssd
      section pack ;;
    session4d)  # call 4: the fused forward's time against what ran before it in the process
      section prep; step ssd_order 170 python3 -m bench.gpu.ssd_order backward; section pack ;;
    session4e)  # call 5: the b1 fused forward probed along the bench topic's own order
      section prep; step ssd_order 190 python3 -m bench.gpu.ssd_order bench; section pack ;;
  esac
}
for s in "$@"; do section "$s"; done
