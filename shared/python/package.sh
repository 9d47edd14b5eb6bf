#!/bin/sh
# package.sh OUT: builds the cohort_plugin wheel and sdist into OUT with
# Debian's python3-build, offline (no build isolation: setuptools and
# wheel come from the system), from a copy of the sources so the checkout
# stays clean. PYTHON picks the interpreter (default /usr/bin/python3).
set -eu
out=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cohort_plugin/_pb" "$out"
cp "$src/pyproject.toml" "$src/README.md" "$tmp/"
cp "$src"/cohort_plugin/*.py "$tmp/cohort_plugin/"
cp "$src"/cohort_plugin/_pb/*.py "$tmp/cohort_plugin/_pb/"
cd "$tmp"
"$py" -m build --no-isolation --sdist --wheel --outdir "$out" . >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
ls "$out"
