#!/usr/bin/env python3
"""update.py: refresh the labs' outputs and pictures from their commands.

Each lab page (docs/labs/*.md) holds one command (the "$ " line of its
```sh block), the output it prints (its ```text block) and, in a comment
"<!-- picture: COMMAND -->", the command that writes its page to "$PAGE".
This runs each command from the source tree with the built gmr-compare
first on the PATH and writes the output into the page; with --pictures it
also renders each page with headless Chromium into the lab's PNG (the part
above the fold: the summary, the table and the first configuration).

tests/compare-labs.sh runs the same commands and fails when an output, or a
figure a verdict quotes, no longer matches: then run this, and reread the
verdicts.

usage: docs/labs/update.py [--pictures] [--build DIR] [LAB.md...]
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))


def command_of(text):
    m = re.search(r"```sh\n\$ (.*?)\n```", text, re.S)
    return m.group(1) if m else None


def run(cmd, env):
    p = subprocess.run(cmd, shell=True, cwd=SRC, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return p.stdout


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--pictures", action="store_true")
    ap.add_argument("--build", default=SRC, help="the build directory (default: the source)")
    ap.add_argument("labs", nargs="*")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    env["PATH"] = os.path.join(os.path.abspath(args.build), "tools") + os.pathsep + env["PATH"]
    labs = args.labs or sorted(glob.glob(os.path.join(HERE, "*.md")))
    for lab in labs:
        text = open(lab).read()
        cmd = command_of(text)
        if cmd is None:
            continue
        out = run(cmd, env).rstrip("\n")
        text = re.sub(r"(\*\*What it prints\.\*\*\n\n```text\n).*?(\n```)",
                      lambda m: m.group(1) + out + m.group(2), text, count=1, flags=re.S)
        open(lab, "w").write(text)
        print("%s: %d lines" % (os.path.basename(lab), out.count("\n") + 1))
        pic = re.search(r"<!-- picture: (.*?) -->", text, re.S)
        if args.pictures and pic:
            chromium = shutil.which("chromium") or shutil.which("chromium-browser")
            if chromium is None:
                sys.exit("update.py: --pictures needs chromium")
            with tempfile.TemporaryDirectory() as tmp:
                page = os.path.join(tmp, "page.html")
                env["PAGE"] = page
                run(pic.group(1), env)
                png = os.path.splitext(lab)[0] + ".png"
                subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                                "--hide-scrollbars", "--screenshot=" + png,
                                "--window-size=900,1250", "file://" + page],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
