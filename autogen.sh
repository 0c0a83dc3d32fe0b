#!/bin/sh
# Regenerate the build system (needs autoconf, automake, libtool, pkg-config).
set -e
cd "$(dirname "$0")"
autoreconf --install --force
