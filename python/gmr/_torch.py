"""Building and installing gmr's native PyTorch allocator (csrc/gmr_torch.cpp).

The adapter is a c10::cuda::CUDACachingAllocator::CUDAAllocator written
against torch's C++ headers, so it is compiled on the user's machine against
the torch that is imported, the first time it is needed (or ahead with
`python3 -m gmr build-torch`), with the C++ compiler (CXX, default g++)
called directly: no ninja, no setuptools.  The result is cached per torch
version and per hash of the source, gmr.h, the compiler and the flags, in
$GMR_CACHE_DIR or ~/.cache/gmr (XDG_CACHE_HOME), as
torch-<version>-<hash>/gmr_torch.so; a file lock (fcntl.flock) makes
parallel processes build it once.  A missing compiler or header raises
BuildError naming it, with the compiler's output.
"""

import ctypes
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "csrc", "gmr_torch.cpp")


class BuildError(RuntimeError):
    """The native adapter could not be built: the message names what was
    missing or shows the compiler's output."""


def _gmr_header_dir():
    """The directory of the gmr.h to compile against: the package's copy
    (the wheel), the source tree's or the bundle's include/, GMR_INCLUDE, the
    system's."""
    cands = [os.path.join(HERE, "include"),
             os.path.normpath(os.path.join(HERE, "..", "..", "include")),
             os.environ.get("GMR_INCLUDE", ""), "/usr/local/include", "/usr/include"]
    for d in cands:
        if d and os.path.isfile(os.path.join(d, "gmr.h")):
            return d
    raise BuildError("gmr: building the native PyTorch adapter needs gmr.h; looked in %s "
                     "(set GMR_INCLUDE to its directory)" % ", ".join(c for c in cands if c))


def _cuda_include_dirs(torch):
    """Directories with cuda_runtime_api.h: what torch's cpp_extension finds,
    then CUDA_HOME, /usr/local/cuda, next to nvcc, the nvidia wheels."""
    cands = []
    try:
        from torch.utils import cpp_extension
        cands += cpp_extension.include_paths(device_type="cuda")
    except Exception:  # no CUDA_HOME: cpp_extension raises OSError
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "include"))
    cands.append("/usr/local/cuda/include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include"))
    site = os.path.dirname(os.path.dirname(torch.__file__))
    cands += sorted(set(os.path.dirname(p) for p in glob.glob(
        os.path.join(site, "nvidia", "**", "include", "cuda_runtime_api.h"), recursive=True)))
    found = [d for d in cands if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))]
    if not found:
        raise BuildError("gmr: building the native PyTorch adapter needs the CUDA runtime "
                         "headers (cuda_runtime_api.h); looked in %s. Install the CUDA "
                         "toolkit's headers or set CUDA_HOME" % ", ".join(cands))
    return found[:1]


def _torch_dirs(torch):
    from torch.utils import cpp_extension
    incs = cpp_extension.include_paths(device_type="cpu")
    libs = cpp_extension.library_paths(device_type="cpu")
    return incs, libs


def _compiler():
    cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx.split()[0])
    if path is None:
        raise BuildError("gmr: building the native PyTorch adapter needs a C++ compiler: "
                         "%r was not found (install g++ or set CXX)" % cxx)
    try:
        ver = subprocess.run(cxx.split() + ["--version"], capture_output=True, text=True,
                             timeout=60).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError("gmr: the C++ compiler %r does not run: %s" % (cxx, e)) from e
    return cxx.split(), (ver[0] if ver else path)


def cache_root():
    d = os.environ.get("GMR_CACHE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gmr")


def _plan(libgmr_path):
    """(commands to try, target path) for the installed torch."""
    try:
        import torch
    except ImportError as e:
        raise BuildError("gmr: the native PyTorch adapter needs PyTorch: %s" % e) from e
    if not os.path.isfile(SOURCE):
        raise BuildError("gmr: the adapter's source %s is missing from this installation"
                         % SOURCE)
    cxx, cxx_version = _compiler()
    gmr_inc = _gmr_header_dir()
    try:
        incs, libs = _torch_dirs(torch)
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        version = torch.__version__
    except (ImportError, AttributeError) as e:
        raise BuildError("gmr: the imported torch gives no C++ headers or libraries "
                         "(torch.utils.cpp_extension): %s" % e) from e
    incs = incs + _cuda_include_dirs(torch) + [gmr_inc]
    libgmr_dir = os.path.dirname(os.path.abspath(libgmr_path))
    common = ["-O2", "-fPIC", "-shared", "-fvisibility=hidden",
              "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi]
    common += ["-I" + d for d in incs]
    # no-as-needed: the CUDA runtime's calls resolve through libc10_cuda's
    # own dependency on libcudart, so it must stay a dependency
    link = ["-L" + d for d in libs] + ["-Wl,--no-as-needed", "-lc10_cuda", "-lc10",
                                       "-Wl,--as-needed"]
    link += ["-Wl,-rpath," + d for d in libs]
    link += [os.path.abspath(libgmr_path), "-Wl,-rpath," + libgmr_dir]
    # Export the two entry points and nothing else.  Where the compiler links
    # parts of libstdc++ into the module, their copies must not be seen by
    # libraries loaded later: cuDNN, dlopen'ed at the first convolution,
    # bound its std::ostream calls to them and crashed (H200, torch 2.11).
    link += ["-Wl,--exclude-libs,ALL", "-Wl,--version-script=@MAP@"]
    h = hashlib.sha256()
    for f in (SOURCE, os.path.join(gmr_inc, "gmr.h")):
        with open(f, "rb") as fh:
            h.update(fh.read())
    h.update(repr((cxx, cxx_version, common, link, version)).encode())
    target = os.path.join(cache_root(), "torch-%s-%s" % (version.replace("+", "_"),
                                                          h.hexdigest()[:16]), "gmr_torch.so")
    cmds = [cxx + ["-std=%s" % std] + common + [SOURCE, "-o", "@OUT@"] + link
            for std in ("c++20", "c++17")]
    return cmds, target


def build(libgmr_path, force=False):
    """Build the adapter unless the cache has it; returns its path."""
    cmds, target = _plan(libgmr_path)
    d = os.path.dirname(target)
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise BuildError("gmr: cannot create the cache directory %s: %s (set GMR_CACHE_DIR)"
                         % (d, e)) from e
    with open(os.path.join(d, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build; the others wait, then load it
        try:
            if os.path.isfile(target) and not force:
                return target
            exports = os.path.join(d, "exports.map")
            with open(exports, "w") as f:
                f.write("{\n  global: gmr_torch_native_*;\n  local: *;\n};\n")
            outputs = []
            for cmd in cmds:
                fd, tmp = tempfile.mkstemp(prefix="gmr_torch.", suffix=".so", dir=d)
                os.close(fd)
                cmd = [tmp if a == "@OUT@" else a.replace("@MAP@", exports) for a in cmd]
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                except (OSError, subprocess.SubprocessError) as e:
                    os.unlink(tmp)
                    raise BuildError("gmr: running the compiler failed: %s" % e) from e
                if r.returncode == 0:
                    os.chmod(tmp, 0o755)
                    os.replace(tmp, target)  # atomic: a reader sees all of it or nothing
                    return target
                os.unlink(tmp)
                outputs.append("$ %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
            raise BuildError("gmr: building the native PyTorch adapter failed:\n%s"
                             % "\n".join(outputs)[-8000:])
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_native = None


def install(libgmr_path):
    """Build (or find in the cache) and load the adapter, then make it
    torch's CUDA allocator.  Raises BuildError, or RuntimeError when torch
    already uses CUDA memory."""
    global _native
    import torch  # noqa: F401  (its libc10 must be loaded before the adapter)

    if _native is None:
        path = build(libgmr_path)
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        lib.gmr_torch_native_install.restype = ctypes.c_int
        lib.gmr_torch_native_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.gmr_torch_native_installed.restype = ctypes.c_int
        lib.gmr_torch_native_installed.argtypes = []
        lib.path = path
        _native = lib
    err = ctypes.create_string_buffer(2048)
    if _native.gmr_torch_native_install(err, len(err)) != 0:
        raise RuntimeError(err.value.decode(errors="replace"))
    return _native


def installed():
    return _native is not None and _native.gmr_torch_native_installed() == 1


def main_build(argv):
    """python3 -m gmr build-torch [--force]: build the adapter ahead."""
    import gmr

    force = "--force" in argv
    try:
        path = build(gmr.library_path(), force=force)
    except (BuildError, OSError) as e:
        print(e, file=sys.stderr)
        return 1
    print("gmr: native PyTorch adapter: %s" % path)
    return 0
