"""python3 -m gmr: which gmr this is and which libgmr it loads.

    python3 -m gmr            prints e.g.
    gmr 0.1.0 (Python package gmr-runtime)
    libgmr 0.1.0: /.../site-packages/gmr/libgmr.so.0 (bundled)
Exit status 1, with every place tried, when no libgmr loads.

    python3 -m gmr build-torch [--force]
builds the native PyTorch adapter into its cache ahead of use (what
gmr.use_in_torch() otherwise does on first use) and prints its path; exit
status 1, with the compiler's output, when it cannot be built.
"""

import sys

import gmr


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "build-torch":
        from gmr import _torch

        return _torch.main_build(sys.argv[2:])
    if len(sys.argv) > 1:
        print("usage: python3 -m gmr [build-torch [--force]]", file=sys.stderr)
        return 2
    print("gmr %s (Python package gmr-runtime)" % gmr.__version__)
    try:
        lib = gmr.library()
    except OSError as e:
        print(e, file=sys.stderr)
        return 1
    print("libgmr %s: %s (%s)" % (lib.version, lib.path, lib.origin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
