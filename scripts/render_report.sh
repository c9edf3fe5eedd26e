#!/usr/bin/env bash
# Render an `mt report` page to a PNG in headless Chromium (Debian package `chromium`), to see
# that it looks right as a browser shows it.
#   bash scripts/render_report.sh report.html report.png [WIDTH] [HEIGHT]
set -euo pipefail
page=$(realpath "$1"); png=$(realpath -m "$2"); width=${3:-1200}; height=${4:-4000}
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "no chromium: apt-get install chromium" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --window-size="$width,$height" \
  --screenshot="$png" "file://$page" > /dev/null 2>&1
[ -s "$png" ] || { echo "chromium wrote no picture" >&2; exit 1; }
echo "wrote $png"
