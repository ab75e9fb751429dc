#!/usr/bin/env bash
# The GPU truth in one command: every chapter and solution under nbval, the whole test suite on
# the GPU (the memory-hungry tests afterwards, one at a time), each part's log and JUnit XML in
# $OUT/verify_logs.tgz, and the pass counts in $OUT/<device>_verify_<date>.json (copy it to
# docs/results/). At most 8 files come back from a device call: hence the one archive.
#
#   MAMBALEARN_COMMIT=<hash> bash bench/gpu/verify.sh   # on the H200, repository root, `.whl` carried
#   NB_PATHS=… TEST_PATHS=… HUNGRY=… bash bench/gpu/verify.sh   # a part of it (defaults: all;
#                                                              # NB_PATHS=none skips the notebooks)
#
# Not run here, because what they test is CPU tooling and they need what the device image lacks
# (Chromium, bubblewrap, nbgrader): the browser, slide, site and grading tests (TOOLING below:
# the grader's exercise copies are built from solutions/ with nbgrader); `make test` runs them. Every kernel those tools launch is a chapter's or a solution's,
# and those run here under nbval.
set -u
OUT=${OUT:-/tmp/out}; LOG=/tmp/verify_logs; rm -rf "$LOG"; mkdir -p "$LOG" "$OUT"
START=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then  # the Jupyter stack for nbval (no package index there)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$LOG/pip.log" 2>&1 || echo "wheel install failed (pip.log)"
fi
export PYTHONPATH=/tmp/site:$PWD MAMBALEARN_PROGRESS=0 MPLBACKEND=Agg PYTHONUNBUFFERED=1
# the device's copy of the repository reports a stale HEAD: name the commit whose tree was sent
export JUPYTER_PLATFORM_DIRS=1 MAMBALEARN_COMMIT=${MAMBALEARN_COMMIT:-"not recorded (set MAMBALEARN_COMMIT)"}
HUNGRY=${HUNGRY-"tests/test_past_2_31.py tests/test_huge.py"}  # tens of GB each: one at a time
TOOLING="test_browser test_slides test_slides_fit test_slides_offline test_site test_grading \
test_grading_holes test_grading_sandbox test_grading_exercises test_grading_selfcheck \
test_gradebook test_submit test_chapters_run test_cli test_exercise_names test_grading_library"
IGNORE=""; for t in $TOOLING; do IGNORE="$IGNORE --ignore=tests/$t.py"; done
# the grading box's own run of a notebook (the device's Jupyter wheels are not on the box's path)
IGNORE="$IGNORE --deselect tests/test_check_ch16.py::test_a_vacuous_claim_fails_when_graded"
for h in $HUNGRY; do IGNORE="$IGNORE --ignore=$h"; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOG/gpu.txt"
part() {  # part NAME SECONDS PYTEST-ARGS...: junit XML and log in $LOG, one line when done
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  # SIGINT at the limit: pytest then still prints the failures so far and writes its XML
  timeout -s INT -k 30 "$limit" python3 -m pytest -p no:cacheprovider -v -rfE --durations=10 \
    --junitxml="$LOG/$name.xml" "$@" > "$LOG/$name.log" 2>&1
  echo "== $name rc=$? $(( $(date +%s) - t0 ))s: $(tail -n 1 "$LOG/$name.log")"
  grep -E "(FAILED|ERROR) " "$LOG/$name.log" | grep -v "^FAILED\|^ERROR" | sed -E "s/.*(FAILED|ERROR) /\1 /" | head -40
}
[ "${NB_PATHS:-}" = none ] || part notebooks "${NB_LIMIT:-400}" --nbval-lax --nbval-current-env -n "${NB_JOBS:-6}" \
  --dist loadfile ${NB_PATHS:-notebooks solutions} &
# (tests one by one over the workers: whole files, --dist loadfile, left one worker on
# test_selective_scan.py for minutes while the others idled)
[ "${TEST_PATHS:-}" = none ] || part tests "${TEST_LIMIT:-400}" -n "${TEST_JOBS:-6}" --dist "${TEST_DIST:-load}" $IGNORE ${TEST_PATHS:-tests} &
wait
for h in $HUNGRY; do part "hungry_$(basename "$h" .py)" "${HUNGRY_LIMIT:-90}" "$h"; done
python3 -m bench.gpu.verify_summary "$LOG" "$OUT" \
  --command "bash bench/gpu/verify.sh" --seconds $(( $(date +%s) - START )); RC=$?
tar czf "$OUT/verify_logs.tgz" -C "$(dirname "$LOG")" "$(basename "$LOG")"
exit $RC
