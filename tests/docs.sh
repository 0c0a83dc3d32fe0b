#!/bin/sh
# docs.sh: docs/config.md is what the option tables generate, so the
# configuration reference can never drift from the code.
BLD=${GMR_BUILDDIR:-.}
SRC=${GMR_SRCDIR:-.}
echo "1..1"
if "$BLD/tools/gmr-demo" --reference | diff -u "$SRC/docs/config.md" - >/tmp/gmr-docs-diff.$$ 2>&1; then
  echo "ok 1 - docs/config.md matches the option tables"
else
  echo "not ok 1 - docs/config.md is out of date: regenerate it with tools/gmr-demo --reference > docs/config.md"
  sed 's/^/# /' /tmp/gmr-docs-diff.$$ | head -40
fi
rm -f /tmp/gmr-docs-diff.$$
