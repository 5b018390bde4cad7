#!/usr/bin/env bash
# Build the workshop decks (slides/decks/ -> slides/build/partN.{md,html,pdf}) with Marp CLI.
#
#   bash scripts/build_slides.sh            # from the committed figures: no notebook is run
#   bash scripts/build_slides.sh --refresh  # first re-run the notebooks (quick mode) against
#                                           # WORKSHOP_BASE_URL / WORKSHOP_HF_BASE_URL (or the
#                                           # servers connect() finds or starts), re-export the
#                                           # figures and reference pages, then build
#   bash scripts/build_slides.sh --refresh --full --only 06_flash_attention
#   bash scripts/build_slides.sh --screenshots ends   # also PNGs of first/last slides
#
# Needs Node.js with npm (Marp CLI is pinned in slides/package-lock.json and installed into
# slides/node_modules on first use) and a Chromium: /usr/bin/chromium (Debian: apt-get install
# chromium) or CHROME_PATH. Marp never downloads a browser here.
set -euo pipefail
cd "$(dirname "$0")/.."

refresh=() build=()
while [ $# -gt 0 ]; do
  case "$1" in
    --refresh) refresh=(--execute) ;;
    --full) refresh+=(--full) ;;
    --only)
      shift; refresh+=(--only)
      while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do refresh+=("$1"); shift; done
      continue ;;
    --screenshots) build+=(--screenshots "$2"); shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

venv=${WORKSHOP_VENV:-.venv}
# shellcheck disable=SC1091
if [ -x "$venv/bin/python" ]; then . "$venv/bin/activate"; fi
export CHROME_PATH=${CHROME_PATH:-/usr/bin/chromium}
command -v npm >/dev/null || { echo "build_slides: needs Node.js and npm" >&2; exit 2; }
[ -x "$CHROME_PATH" ] || {
  echo "build_slides: no Chromium at $CHROME_PATH (apt-get install chromium, or set CHROME_PATH)" >&2
  exit 2
}

# Install the pinned Marp CLI when missing or when the lock file changed since.
lock=slides/package-lock.json installed=slides/node_modules/.package-lock.json
if [ ! -x slides/node_modules/.bin/marp ] || [ "$lock" -nt "$installed" ]; then
  echo "==> installing Marp CLI (slides/package-lock.json)"
  (cd slides && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi

if [ ${#refresh[@]} -gt 0 ] && [ "${refresh[0]}" = --execute ]; then
  echo "==> running the notebooks and exporting their figures"
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python slides/export_figures.py "${refresh[@]}"
elif [ ${#refresh[@]} -gt 0 ]; then
  echo "build_slides: --full and --only go with --refresh" >&2; exit 2
fi
echo "==> building the decks"
python slides/build_decks.py "${build[@]}"
