"""python3 -m gmr: which gmr this is and which libgmr it loads.

    python3 -m gmr            prints e.g.
    gmr 0.1.0 (Python package gmr-runtime)
    libgmr 0.1.0: /.../site-packages/gmr/libgmr.so.0 (bundled)
Exit status 1, with every place tried, when no libgmr loads.
"""

import sys

import gmr


def main():
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
