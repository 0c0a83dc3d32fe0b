#!/bin/bash
# wheel.sh: the gmr-runtime wheel on a CUDA machine with PyTorch, as a user
# installs it: a fresh virtual environment (seeing the system's PyTorch), pip
# with no index, then from an empty folder with nothing set:
#   1. import gmr loads the libgmr bundled in the wheel and the libyaml
#      bundled beside it (/proc/self/maps);
#   2. gmr.use_in_torch("pytorch"): a CUDA tensor of 64 MiB is allocated
#      through gmr (gmr.stats: allocated_bytes 67108864);
#   3. gmr.compare on a small trace gives gmr-compare's figures
#      (pytorch: peak_reserved 62914560, direct: 56623104);
#   4. LD_PRELOAD=<the wheel's>/libgmr-preload.so: PyTorch's own allocator's
#      cudaMalloc reaches gmr (gmr.library().origin == "already loaded",
#      reserved_bytes > 0).
# Prints "wheel: PASS" at the end, "wheel: FAIL ..." otherwise (exit 1).
#
#   scripts/gpu/wheel.sh gmr_runtime-VERSION-py3-none-manylinux_2_X_x86_64.whl
set -u
whl=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no CUDA device (nvidia-smi -L failed)"
  exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-wheel-gpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "wheel: FAIL $*"; exit 1; }
python3 -m venv --system-site-packages "$tmp/venv" || fail "python3 -m venv"
# Where python3 is itself a virtual environment (PyTorch installed there),
# --system-site-packages reaches only the base interpreter's packages: the new
# environment sees the outer one's through a .pth file, as a user's nested
# environment would.
inner=$("$tmp/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
python3 -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")' \
  >"$inner/gmr-outer-env.pth"
"$tmp/venv/bin/python" -c 'import torch' || fail "torch is not importable from the environment"
PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$tmp/venv/bin/python" -m pip install -q --no-index \
  --no-deps "$whl" || fail "pip install --no-index $whl"
mkdir "$tmp/empty"
cd "$tmp/empty" || exit 1
printf 'Thread,Time,Action,Pointer,Size,Stream\n' >trace.csv
for k in 1 2 3 4 5 6; do printf '0,%d,allocate,0x%d000,9437184,0\n' "$k" "$k"; done >>trace.csv
for k in 1 2 3 4 5 6; do printf '0,%d,free,0x%d000,9437184,0\n' $((k + 6)) "$k"; done >>trace.csv
clean_env=(env -u LD_LIBRARY_PATH -u LD_PRELOAD -u PYTHONPATH -u GMR_LIBRARY -u GMR_CONFIG)

"${clean_env[@]}" timeout 300 "$tmp/venv/bin/python" - <<'PYEOF' || fail "steps 1-3"
import os
import gmr
import torch
lib = gmr.library()
print("wheel: gmr %s, libgmr %s from %s (%s)" % (gmr.__version__, lib.version, lib.path, lib.origin))
assert lib.origin == "bundled", lib
maps = open("/proc/self/maps").read()
yaml = sorted({l.split()[-1] for l in maps.splitlines() if "libyaml" in l})
print("wheel: libyaml loaded from", yaml)
assert yaml == [os.path.join(os.path.dirname(os.path.realpath(lib.path)), "libyaml-0.so.2")], yaml
gmr.use_in_torch("pytorch")
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
s = gmr.stats(0)
print("wheel: torch through gmr: policy %s, allocated_bytes %d" % (gmr.policy(0),
                                                                   s["allocated_bytes"]))
assert s["allocated_bytes"] == 64 << 20, s["allocated_bytes"]
del x
runs = gmr.compare("trace.csv", ["pytorch", "direct"])
print("wheel: compare", [(r["config"], r["status"], r["peak_reserved"]) for r in runs])
assert [r["peak_reserved"] for r in runs] == [62914560, 56623104], runs
PYEOF

pkg=$("${clean_env[@]}" "$tmp/venv/bin/python" -c 'import gmr, os; print(os.path.dirname(gmr.__file__))')
[ -f "$pkg/libgmr-preload.so" ] || fail "the wheel has no libgmr-preload.so (built without CUDA?)"
"${clean_env[@]}" LD_PRELOAD="$pkg/libgmr-preload.so" timeout 300 "$tmp/venv/bin/python" - <<'PYEOF' || fail "step 4"
import torch
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
import gmr
lib = gmr.library()
s = gmr.stats(0)
print("wheel: LD_PRELOAD interposer: libgmr %s (%s), policy %s, reserved_bytes %d" % (
    lib.path, lib.origin, gmr.policy(0), s["reserved_bytes"]))
assert lib.origin == "already loaded", lib
assert s["reserved_bytes"] >= 64 << 20, s
PYEOF
echo "wheel: PASS"
