"""Shared pieces of the Python tests: where the source and build trees are
(tests/python.sh exports GMR_SRCDIR and GMR_BUILDDIR), and a helper that
runs code in a fresh interpreter (the process-wide runtime is built once per
process)."""

import os
import subprocess
import sys
import textwrap

import pytest

SRCDIR = os.path.abspath(os.environ.get("GMR_SRCDIR", os.path.join(os.path.dirname(__file__),
                                                                   "..", "..")))
BUILDDIR = os.path.abspath(os.environ.get("GMR_BUILDDIR", SRCDIR))


def run_child(code, env=None, cwd=None):
    """Run `code` in a fresh interpreter; returns (rc, stdout+stderr)."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, cwd=cwd,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    return p.returncode, p.stdout.decode(errors="replace")


@pytest.fixture
def srcdir():
    return SRCDIR


@pytest.fixture
def builddir():
    return BUILDDIR
