#!/usr/bin/env bash
# Build gradescope_autograder.zip (upload it as the assignment's autograder): setup.sh and
# run_autograder at the top, the course's package, sources (solutions/, with hidden tests: keep the zip
# private) and requirements beside them. Run from the course's root: bash tools/gradescope/make_zip.sh
set -euo pipefail
out=${1:-gradescope_autograder.zip}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp tools/gradescope/setup.sh tools/gradescope/run_autograder "$tmp/"
chmod +x "$tmp/setup.sh" "$tmp/run_autograder"
git archive --format=tar HEAD course_lib solutions requirements.txt pyproject.toml README.md LICENSE | tar -x -C "$tmp"
rm -f "$out"
(cd "$tmp" && python3 -m zipfile -c "$OLDPWD/$out" setup.sh run_autograder course_lib solutions requirements.txt pyproject.toml README.md LICENSE)
echo "wrote $out ($(du -h "$out" | cut -f1)); upload it as the autograder, keep it private (hidden tests inside)"
