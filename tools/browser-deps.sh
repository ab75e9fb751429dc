#!/usr/bin/env bash
# What the browser tests, offline decks, PDFs and the grader's sandbox need besides Python packages:
# Debian's chromium (driven by Playwright; never a downloaded browser build), npm (reveal.js,
# MathJax... come from the npm registry, see mambalearn/slides_offline.py) and bubblewrap (bwrap:
# each graded submission runs in its own box, see docs/GRADING.md). Idempotent: installs only what
# is missing. Arguments pick some: `tools/browser-deps.sh bwrap` (what `make grade` needs).
set -euo pipefail
chromium=${MAMBALEARN_CHROMIUM:-/usr/bin/chromium}
want=${*:-chromium npm bwrap}
need=()
[[ " $want " == *" chromium "* ]] && { [ -x "$chromium" ] || need+=(chromium); }
[[ " $want " == *" npm "* ]] && { command -v npm >/dev/null 2>&1 || need+=(npm); }
[[ " $want " == *" bwrap "* ]] && { command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap); }
[ ${#need[@]} -eq 0 ] && exit 0
if [[ " ${need[*]} " == *" bubblewrap "* ]]; then  # say why before anything is installed
  echo "Grading runs each notebook in a bubblewrap box (bwrap): no network, nothing written outside" \
       "a scratch folder, your files and the course's answers out of reach, limits on processes and" \
       "file sizes (docs/GRADING.md). bubblewrap is not installed; installing it (once)."
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v apt-get >/dev/null 2>&1 || { [ -n "$sudo" ] && ! sudo -n true 2>/dev/null; }; then
  echo "missing: ${need[*]}. Install them (Debian/Ubuntu: apt-get install ${need[*]}), or set" \
       "MAMBALEARN_CHROMIUM to a Chromium binary; the browser and sandbox tests are skipped until" \
       "then, and grading runs unboxed (with a warning)." >&2
  [ -n "${CI:-}" ] && exit 1  # in CI a missing browser or sandbox is a failure, not a skip
  exit 0
fi
echo "installing ${need[*]} from Debian's packages"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
