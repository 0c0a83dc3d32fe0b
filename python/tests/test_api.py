"""The package's surface: version, exports, which library it loads, and how
it treats bad arguments (TypeError/ValueError with a sentence), paths given
as str, bytes or os.PathLike, and a runtime creation that failed."""

import os
import pathlib
import re

import pytest

import gmr
from conftest import SRCDIR, run_child


def _header_version():
    with open(os.path.join(SRCDIR, "include", "gmr.h")) as f:
        text = f.read()
    parts = [re.search(r"#define GMR_VERSION_%s (\d+)" % k, text).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def test_version_is_the_librarys():
    assert gmr.__version__ == _header_version()
    assert gmr.library().version == gmr.__version__
    assert gmr._library().gmr_version().decode() == gmr.__version__


def test_all_names_the_public_surface_and_nothing_else():
    public = {n for n in dir(gmr) if not n.startswith("_")}
    assert public == set(gmr.__all__) - {"__version__"}
    for name in ("ctypes", "os", "libc", "tempfile", "threading", "load"):
        assert name not in public
    for name in gmr.__all__:
        assert hasattr(gmr, name), name


def test_library_says_which_and_why():
    lib = gmr.library()
    assert lib.origin == "GMR_LIBRARY"  # tests/python.sh names the build's
    assert lib.path == os.environ["GMR_LIBRARY"]
    assert gmr.library_path() == lib.path
    assert "GMR_LIBRARY" in repr(lib)


def test_a_library_of_another_version_is_refused(tmp_path):
    rc, out = run_child("""
        import gmr
        gmr.__version__ = "9.9.9"
        gmr.stats(0)
    """)
    assert rc != 0
    assert "libgmr 0.1.0, this package needs 9.9.9" in out.replace(gmr.__version__, "0.1.0")


def test_a_missing_library_names_every_place_tried():
    rc, out = run_child("import gmr; gmr.stats(0)",
                        env={"GMR_LIBRARY": "/nonexistent/libgmr.so.0"})
    assert rc != 0
    assert "set GMR_LIBRARY" in out and "/nonexistent/libgmr.so.0" in out


def test_python_m_gmr_prints_version_and_library():
    rc, out = run_child("import runpy; runpy.run_module('gmr', run_name='__main__')")
    assert rc == 0, out
    assert out.splitlines()[0] == "gmr %s (Python package gmr-runtime)" % gmr.__version__
    assert out.splitlines()[1] == "libgmr %s: %s (GMR_LIBRARY)" % (
        gmr.__version__, os.environ["GMR_LIBRARY"])


@pytest.mark.parametrize("device", [1 << 32, (1 << 31), -1, -(1 << 40)])
def test_a_device_out_of_int_range_is_a_value_error(device):
    with pytest.raises(ValueError, match="CUDA ordinal"):
        gmr.stats(device)


@pytest.mark.parametrize("device", ["0", 0.0, None, True])
def test_a_device_that_is_not_an_int_is_a_type_error(device):
    with pytest.raises(TypeError, match="must be a CUDA ordinal"):
        gmr.policy(device)


def _sim_config(tmp_path, name="sim.yaml"):
    p = tmp_path / name
    p.write_text("device: {backend: sim, capacity: 1GiB}\npolicy: direct\n")
    return p


@pytest.mark.parametrize("kind", [str, os.fsencode, pathlib.Path])
def test_configure_takes_str_bytes_and_pathlike(tmp_path, kind):
    path = _sim_config(tmp_path)
    rc, out = run_child("""
        import gmr, pathlib, os, sys
        arg = %s(%r)
        print(gmr.configure(arg))
        print(gmr.policy(0))
    """ % ({str: "str", os.fsencode: "os.fsencode", pathlib.Path: "pathlib.Path"}[kind],
           str(path)), env={"GMR_CONFIG": ""})
    assert rc == 0, out
    assert out.split() == [str(path), "direct"]


def test_configure_takes_a_name(tmp_path):
    rc, out = run_child("""
        import gmr
        print(gmr.configure("direct"))
        print(gmr.policy(0))
    """, env={"GMR_CONFIG": ""}, cwd=SRCDIR)
    assert rc == 0, out
    assert out.split() == [os.path.join(SRCDIR, "config", "direct.yaml"), "direct"]


def test_configure_rejects_what_is_not_a_path():
    with pytest.raises(TypeError, match="must be a path"):
        gmr.configure(42)
    with pytest.raises(ValueError, match="NUL"):
        gmr.configure("a\0b.yaml")


def test_snapshot_takes_a_pathlike_and_rejects_a_number(tmp_path):
    with pytest.raises(TypeError, match="must be a path"):
        gmr.snapshot(3.5)
    out = tmp_path / "snap.pickle"
    gmr.snapshot(out)
    assert out.stat().st_size > 0


def test_a_failed_runtime_creation_can_be_retried_with_a_good_config(tmp_path):
    """A configuration that loads but cannot make a runtime (a CUDA device on
    a machine with none) fails the first call; configure() may then name a
    good file, and the next call builds the runtime from it."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("device: {backend: cuda}\npolicy: direct\n")
    good = _sim_config(tmp_path, "good.yaml")
    rc, out = run_child("""
        import gmr
        gmr.configure(%r)
        try:
            gmr.stats(0)
            print("FIRST-WORKED")
        except gmr.GmrError as e:
            print("first failed:", e)
        gmr.configure(%r)
        print("policy", gmr.policy(0))
    """ % (str(bad), str(good)), env={"GMR_CONFIG": ""})
    if "FIRST-WORKED" in out:
        pytest.skip("this machine has a CUDA device: the bad configuration works here")
    assert rc == 0, out
    assert "first failed: gmr: no runtime for device 0" in out
    assert out.strip().endswith("policy direct")
