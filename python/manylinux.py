#!/usr/bin/env python3
"""manylinux.py: the manylinux check of the gmr-runtime wheel (PEP 600).

python/build-wheel.sh runs it where auditwheel would be used (Debian does not
package auditwheel): on the staged package, to compute the wheel's platform
tag from the ELF files it carries, and on the built wheel, to check its name,
its WHEEL tags, its RECORD and its ELF files again.  Every ELF file is read
here (no readelf needed) for its DT_NEEDED, RUNPATH and symbol version needs;
the rules are in Note [Manylinux policy].  Standard library only.

  manylinux.py tag DIR [--plat TAG]     print the tag the ELF files under DIR allow
  manylinux.py check WHEEL [--plat TAG] check a built wheel; print its tag
  manylinux.py show FILE...             each ELF file's needs, as the check reads them
"""
import base64
import csv
import hashlib
import io
import os
import re
import struct
import sys
import zipfile

# Note [Manylinux policy]
# ~~~~~~~~~~~~~~~~~~~~~~~
# PEP 600: a wheel tagged manylinux_2_X_x86_64 runs on any x86_64 Linux
# whose glibc is 2.X or newer.  X is the newest GLIBC_2.N version that any
# ELF file in the wheel needs (at least 5, the oldest tag).  Beyond glibc the
# wheel may take from the system only the libraries every such Linux has:
# glibc's own (ALLOWED below), libgcc_s and libstdc++, with C++ versions no
# newer than those of the reference distribution of that glibc (POLICIES:
# the x86_64 maxima of auditwheel's manylinux-policy.json); a C++ need newer
# than X allows raises X to the first row that allows it.  The policy also
# allows X11, GL, glib, libz and libexpat; gmr needs none of them, so a need
# for one is taken for a mistake and refused too.  Any other library must be
# in the wheel, beside the ELF file that needs it, found through RUNPATH
# $ORIGIN; no RUNPATH may point outside the wheel.  A few libc symbols are
# refused whatever their version (BLACKLIST: not in every glibc of a tag).
# X <= 17 also gets the legacy alias of PEP 513/571/599 (manylinux1 for 2_5,
# manylinux2010 for 2_12, manylinux2014 for 2_17), the smallest one that
# covers X, as auditwheel writes, so that pip < 20.3 installs it too.  A
# glibc newer than the last row gets its own tag with that row's C++ maxima
# (PEP 600 defines a tag for every glibc).  --plat TAG asks for a tag: the
# check fails when the wheel needs a newer one, naming what needs it.

ALLOWED = {
    "libc.so.6", "libm.so.6", "libmvec.so.1", "libdl.so.2", "librt.so.1", "libpthread.so.0",
    "libutil.so.1", "libresolv.so.2", "libnsl.so.1", "libanl.so.1", "ld-linux-x86-64.so.2",
    "libgcc_s.so.1", "libstdc++.so.6",
}
# (glibc minor, newest GLIBCXX, newest CXXABI, newest GCC) allowed, x86_64.
POLICIES = [
    (5, "3.4.8", "1.3.1", "4.2.0"),
    (12, "3.4.13", "1.3.3", "4.3.0"),
    (17, "3.4.19", "1.3.7", "4.8.0"),
    (24, "3.4.22", "1.3.10", "4.8.0"),
    (27, "3.4.24", "1.3.11", "7.0.0"),
    (31, "3.4.28", "1.3.12", "7.0.0"),
    (34, "3.4.29", "1.3.13", "7.0.0"),
    (35, "3.4.30", "1.3.13", "12.0.0"),
    (39, "3.4.33", "1.3.15", "14.0.0"),
]
# CXXABI versions that are not numbers, and the glibc row that allows each.
CXXABI_NAMED = {"TM_1": 17, "FLOAT128": 24}
LEGACY = [(5, "manylinux1"), (12, "manylinux2010"), (17, "manylinux2014")]
BLACKLIST = {
    "__cxa_thread_atexit_impl", "__issignaling", "__issignalingf", "__issignalingl",
    "pthread_getattr_default_np", "pthread_setattr_default_np",
}
ARCH = "x86_64"


class Refused(Exception):
    """The file or the wheel breaks the policy; the message says how."""


def vkey(text):
    return tuple(int(p) for p in text.split("."))


class Elf:
    """What the policy looks at in one ELF file: soname, needed, runpath,
    needs ({(library, version name)}) and undefined (symbol names)."""

    def __init__(self, name, data):
        self.name = name
        if data[:4] != b"\x7fELF":
            raise Refused("%s: not an ELF file" % name)
        try:
            self._read(data)
        except (struct.error, IndexError, ValueError) as e:
            raise Refused("%s: a truncated or malformed ELF file (%s)" % (name, e))

    def _read(self, data):
        name = self.name
        if data[4:6] != b"\x02\x01":
            raise Refused("%s: not a 64-bit little-endian ELF file" % name)
        machine, = struct.unpack_from("<H", data, 18)
        if machine != 62:
            raise Refused("%s: not an x86_64 ELF file (e_machine %d)" % (name, machine))
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        if shoff == 0 or shnum == 0:
            raise Refused("%s: an ELF file without section headers" % name)
        self.sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                         for i in range(shnum)]
        self.data = data
        self.soname, self.needed, self.runpath, self.rpath = None, [], [], []
        self.needs, self.undefined = set(), set()
        for sec in self.sections:
            kind, offset, size, link, info = sec[1], sec[4], sec[5], sec[6], sec[7]
            if kind == 6:  # SHT_DYNAMIC
                self._dynamic(offset, size, link)
            elif kind == 0x6FFFFFFE:  # SHT_GNU_verneed
                self._verneed(offset, info, link)
            elif kind == 11:  # SHT_DYNSYM
                self._dynsym(offset, size, link)
        del self.data, self.sections

    def _str(self, link, at):
        base = self.sections[link][4]
        end = self.data.index(b"\0", base + at)
        return self.data[base + at:end].decode("utf-8", "replace")

    def _dynamic(self, offset, size, link):
        for at in range(offset, offset + size - 15, 16):
            tag, val = struct.unpack_from("<qQ", self.data, at)
            if tag == 0:
                break
            if tag == 1:
                self.needed.append(self._str(link, val))
            elif tag == 14:
                self.soname = self._str(link, val)
            elif tag == 29:
                self.runpath = self._str(link, val).split(":")
            elif tag == 15:
                self.rpath = self._str(link, val).split(":")

    def _verneed(self, offset, count, link):
        at = offset
        for _ in range(count):
            _, cnt, vfile, aux, nxt = struct.unpack_from("<HHIII", self.data, at)
            lib = self._str(link, vfile)
            a = at + aux
            for _ in range(cnt):
                _, _, _, vname, anext = struct.unpack_from("<IHHII", self.data, a)
                self.needs.add((lib, self._str(link, vname)))
                a += anext
            at += nxt

    def _dynsym(self, offset, size, link):
        for at in range(offset + 24, offset + size - 23, 24):  # entry 0 is null
            name, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", self.data, at)
            if shndx == 0 and name:
                self.undefined.add(self._str(link, name))


def read_elfs(files):
    """{path: Elf} for the (path, bytes) pairs that are ELF files."""
    return {p: Elf(p, d) for p, d in files if d[:4] == b"\x7fELF"}


def glibc_row(x):
    """The newest POLICIES row at or before glibc 2.x (the first if none)."""
    rows = [r for r in POLICIES if r[0] <= x]
    return rows[-1] if rows else POLICIES[0]


def parse_plat(plat):
    """glibc minor of a requested tag: manylinux_2_X_x86_64 or a legacy name."""
    for x, legacy in LEGACY:
        if plat in (legacy, legacy + "_" + ARCH):
            return x
    m = re.fullmatch(r"manylinux_2_(\d+)(_%s)?" % ARCH, plat)
    if not m:
        raise Refused("--plat %s: not a manylinux tag for %s (manylinux_2_X_%s)" % (plat, ARCH, ARCH))
    return int(m.group(1))


def compute(elfs, plat=None):
    """The platform tag the ELF files allow ("manylinux_2_X_x86_64" and its
    alias, dot-separated); Refused naming every breach otherwise."""
    problems = []
    have = {}  # the libraries the wheel carries, by directory: {dir: {soname or name}}
    for path, elf in elfs.items():
        have.setdefault(os.path.dirname(path), set()).update(
            {os.path.basename(path), elf.soname or os.path.basename(path)})
    x, why = 5, "the oldest manylinux"
    cxx = []  # (name, version, path): C++ needs, checked once X is known
    for path, elf in sorted(elfs.items()):
        here = os.path.dirname(path)
        for entry in elf.runpath + elf.rpath:
            if not entry.startswith(("$ORIGIN", "${ORIGIN}")):
                problems.append("%s: its RUNPATH %s points outside the wheel (patchelf --set-rpath '$ORIGIN')"
                                % (path, ":".join(elf.runpath + elf.rpath)))
                break
        for lib in elf.needed:
            if lib in have.get(here, ()):
                if not any(e in ("$ORIGIN", "${ORIGIN}") for e in elf.runpath + elf.rpath):
                    problems.append("%s needs %s, which the wheel carries beside it, but its RUNPATH (%s) "
                                    "does not look there (patchelf --set-rpath '$ORIGIN')"
                                    % (path, lib, ":".join(elf.runpath) or "none"))
            elif lib not in ALLOWED:
                problems.append("%s needs %s, which the manylinux policy does not allow from the system "
                                "and the wheel does not carry (bundle it beside %s, or link it statically)"
                                % (path, lib, os.path.basename(path)))
        for lib, version in sorted(elf.needs):
            if lib not in ALLOWED or lib in have.get(here, ()):
                continue  # a library the wheel carries: its own versions
            name, _, num = version.partition("_")
            if name == "GLIBC" and re.fullmatch(r"2\.\d+(\.\d+)?", num):
                if vkey(num)[1] > x:
                    x, why = vkey(num)[1], "%s needs %s (%s)" % (path, version, lib)
            elif name in ("GLIBCXX", "CXXABI", "GCC") and (re.fullmatch(r"[\d.]+", num)
                                                          or (name == "CXXABI" and num in CXXABI_NAMED)):
                cxx.append((name, num, path))
            else:
                problems.append("%s needs %s from %s, which no manylinux tag allows" % (path, version, lib))
        for sym in sorted(elf.undefined & BLACKLIST):
            problems.append("%s uses %s, which the manylinux policy refuses (not in every glibc of a tag)"
                            % (path, sym))
    for name, num, path in cxx:
        column = {"GLIBCXX": 1, "CXXABI": 2, "GCC": 3}[name]

        def fits(row):
            if name == "CXXABI" and num in CXXABI_NAMED:
                return row[0] >= CXXABI_NAMED[num]
            return vkey(num) <= vkey(row[column])
        if fits(glibc_row(x)):
            continue
        rows = [r for r in POLICIES if r[0] > x and fits(r)]
        if not rows:
            problems.append("%s needs %s_%s, newer than any manylinux tag allows (newest: %s_%s)"
                            % (path, name, num, name, POLICIES[-1][column]))
            continue
        x, why = rows[0][0], "%s needs %s_%s" % (path, name, num)
    if plat is not None:
        want = parse_plat(plat)
        if x > want:
            problems.append("the wheel needs manylinux_2_%d, newer than --plat %s: %s" % (x, plat, why))
        x = max(x, want)
    if problems:
        raise Refused("\n".join(problems))
    tag = "manylinux_2_%d_%s" % (x, ARCH)
    aliases = [legacy for lx, legacy in LEGACY if lx >= x]
    if aliases:
        tag += ".%s_%s" % (aliases[0], ARCH)
    return tag


def files_under(top):
    for root, dirs, names in os.walk(top):
        dirs.sort()
        for n in sorted(names):
            p = os.path.join(root, n)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    yield os.path.relpath(p, top), f.read()


def check_wheel(path, plat=None):
    """Check a built wheel: its ELF files (compute), that its file name and
    its WHEEL file carry that tag, and that its RECORD lists every file once
    with its size and sha256.  Returns the tag."""
    problems = []
    with zipfile.ZipFile(path) as z:
        files = [(n, z.read(n)) for n in z.namelist() if not n.endswith("/")]
    tag = compute(read_elfs(files), plat)
    m = re.fullmatch(r"([^-]+)-([^-]+)-py3-none-(.+)\.whl", os.path.basename(path))
    if not m:
        raise Refused("%s: not a py3-none wheel's name" % path)
    if m.group(3) != tag:
        problems.append("%s: its name says %s, its ELF files make it %s" % (path, m.group(3), tag))
    info = "%s-%s.dist-info/" % (m.group(1), m.group(2))
    content = dict(files)
    if info + "WHEEL" not in content or info + "RECORD" not in content:
        raise Refused("%s: no %sWHEEL or %sRECORD" % (path, info, info))
    wheel = content[info + "WHEEL"].decode()
    tags = sorted(l.split(":", 1)[1].strip() for l in wheel.splitlines() if l.startswith("Tag:"))
    if tags != sorted("py3-none-" + p for p in tag.split(".")):
        problems.append("%s: its WHEEL file says %s, not py3-none-%s" % (path, ", ".join(tags), tag))
    if "Root-Is-Purelib: false" not in wheel:
        problems.append("%s: its WHEEL file does not say Root-Is-Purelib: false" % path)
    listed = {}
    for row in csv.reader(io.StringIO(content[info + "RECORD"].decode())):
        if not row:
            continue
        if row[0] in listed:
            problems.append("%s: RECORD lists %s twice" % (path, row[0]))
        listed[row[0]] = row[1:]
    for name, data in files:
        if name == info + "RECORD":
            continue
        if name not in listed:
            problems.append("%s: RECORD does not list %s" % (path, name))
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if listed[name] != ["sha256=" + digest, str(len(data))]:
            problems.append("%s: RECORD says %s for %s, which has sha256=%s and %d bytes"
                            % (path, ",".join(listed[name]), name, digest, len(data)))
    for name in sorted(set(listed) - set(content)):
        problems.append("%s: RECORD lists %s, which the wheel lacks" % (path, name))
    if problems:
        raise Refused("\n".join(problems))
    return tag


def show(path):
    with open(path, "rb") as f:
        elf = Elf(path, f.read())
    print("%s:" % path)
    print("  soname %s" % (elf.soname or "-"))
    print("  needed %s" % " ".join(elf.needed))
    print("  runpath %s" % (":".join(elf.runpath) or "-"))
    print("  rpath %s" % (":".join(elf.rpath) or "-"))
    for lib, version in sorted(elf.needs):
        print("  version %s %s" % (lib, version))


def main(argv):
    args = argv[1:]
    plat = None
    if "--plat" in args:
        i = args.index("--plat")
        if i + 1 >= len(args):
            raise Refused("--plat needs a tag")
        plat = args[i + 1]
        del args[i:i + 2]
    if len(args) == 2 and args[0] == "tag":
        print(compute(read_elfs(files_under(args[1])), plat))
    elif len(args) == 2 and args[0] == "check":
        print(check_wheel(args[1], plat))
    elif len(args) >= 2 and args[0] == "show":
        for p in args[1:]:
            show(p)
    else:
        sys.stderr.write(__doc__.split("\n\n")[-1])
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (Refused, OSError, zipfile.BadZipFile) as e:
        for line in str(e).splitlines():
            sys.stderr.write("manylinux.py: %s\n" % line)
        sys.exit(1)
