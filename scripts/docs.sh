#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/; the reference pages are generated from the code by
# scripts/docs_reference.py at every build).
#   bash scripts/docs.sh            build into site/ in strict mode: a broken link, a missing page
#                                   or a missing reference fails the build
#   bash scripts/docs.sh serve      serve it at http://127.0.0.1:8000, rebuilt on every edit
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_MKDOCS_2_WARNING=1
if [ "${1:-build}" = serve ]; then
  exec ${PYTHON:-python3} -m mkdocs serve
fi
${PYTHON:-python3} -m mkdocs build --strict --quiet
echo "docs: built site/ ($(find site -name index.html | wc -l) pages)"
