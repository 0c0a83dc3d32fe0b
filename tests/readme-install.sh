#!/bin/sh
# readme-install.sh: the install commands a new user copies work on a machine
# whose package lists are empty (container images): every `apt-get install`
# in README.md and docs/ follows an `apt-get update &&` on its line; the
# README's packaging section says how to get the build dependencies
# (apt-get build-dep ./) or do without them (nocheck); and debian/rules runs
# the suite in parallel when DEB_BUILD_OPTIONS says parallel=N.
SRC=${GMR_SRCDIR:-.}
echo "1..3"
bad=$(cd "$SRC" && grep -rn 'apt-get install' README.md docs --include='*.md' | grep -v 'apt-get update && apt-get install')
if [ -z "$bad" ]; then
  echo "ok 1 - every apt-get install in README.md and docs/ comes after apt-get update &&"
else
  echo "not ok 1 - apt-get install without apt-get update && before it:"
  printf '%s\n' "$bad" | sed 's/^/# /'
fi
if grep -q 'apt-get build-dep -y \./' "$SRC/README.md" && grep -q 'DEB_BUILD_OPTIONS=nocheck' "$SRC/README.md"; then
  echo "ok 2 - README.md gives apt-get build-dep ./ and DEB_BUILD_OPTIONS=nocheck"
else
  echo "not ok 2 - README.md lacks apt-get build-dep -y ./ or DEB_BUILD_OPTIONS=nocheck"
fi
if grep -q 'dh_auto_test' "$SRC/debian/rules" && ! grep -q -- '--no-parallel' "$SRC/debian/rules"; then
  echo "ok 3 - debian/rules runs the suite with DEB_BUILD_OPTIONS parallel=N (no --no-parallel)"
else
  echo "not ok 3 - debian/rules runs the suite serially"
fi
