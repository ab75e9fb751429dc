#!/usr/bin/env bash
# What the browser tests, offline decks and PDFs need besides Python packages: Debian's chromium
# (driven by Playwright; never a downloaded browser build) and npm (reveal.js, MathJax... come
# from the npm registry, see mambalearn/slides_offline.py). Idempotent: installs only what is missing.
set -euo pipefail
chromium=${MAMBALEARN_CHROMIUM:-/usr/bin/chromium}
need=()
[ -x "$chromium" ] || need+=(chromium)
command -v npm >/dev/null 2>&1 || need+=(npm)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v apt-get >/dev/null 2>&1 || { [ -n "$sudo" ] && ! sudo -n true 2>/dev/null; }; then
  echo "missing: ${need[*]}. Install them (Debian/Ubuntu: apt-get install ${need[*]}), or set" \
       "MAMBALEARN_CHROMIUM to a Chromium binary; the browser tests are skipped until then." >&2
  [ -n "${CI:-}" ] && exit 1  # in CI a missing browser is a failure, not a skip
  exit 0
fi
echo "installing ${need[*]} from Debian's packages"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
