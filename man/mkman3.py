#!/usr/bin/env python3
"""mkman3.py: the API reference as man 3 pages, from the public headers'
own comments (include/gmr.h, gmr_replay.h, gmr_hooks.h).

One page per group of calls: gmr.h's banner sections (Configuration,
Runtime, Statistics...) each make one page, gmr.h's preamble makes gmr(3)
(the conventions, error codes and version), and gmr_replay.h and
gmr_hooks.h one page each.  A page shows its calls and types in the order
and with the words of the header; every call also gets a page of its own
name that sources its group's (.so), so `man gmr_alloc` finds it.  The
pages are kept in git (man/man3/) like the other man pages; tests/man3.sh
checks that they are what this script makes of the headers now, and
`make update-man` rewrites them.

  man/mkman3.py SRCDIR OUTDIR     write OUTDIR/*.3 and OUTDIR/pages.am
"""
import os
import re
import sys

# Banner title (its first words) -> page name; a section not listed here is
# named gmr_ + its first word.
PAGE_OF_SECTION = [
    ("Configuration", "gmr_config",
     "load configurations, find them by name, list the policies and their options"),
    ("Runtime", "gmr_runtime", "create and free runtimes; allocate, free and record streams"),
    ("Statistics", "gmr_stats", "statistics, summaries and the last error"),
    ("Introspection", "gmr_walk", "segments and blocks, invariants, the device and its backend"),
    ("Memory history", "gmr_history", "the memory history and PyTorch memory snapshots"),
    ("Private pools", "gmr_pool", "private pools and CUDA graph capture"),
    ("Segments", "gmr_segment", "the segment of a pointer, and the memory fraction"),
    ("Simulated device", "gmr_sim", "controls of the simulated device, for tests and tools"),
    ("Shared caps", "gmr_shared_cap", "read shared-cap files: one cap on a device across processes"),
    ("Logging", "gmr_set_log", "route the library's messages"),
    ("Tags", "gmr_sleep", "tagged regions that sleep and wake at the same addresses"),
]
HEADERS = [("gmr.h", "gmr"), ("gmr_replay.h", "gmr_replay"), ("gmr_hooks.h", "gmr_hooks")]
SKIP_DIRECTIVES = re.compile(r"^#\s*(if|ifdef|ifndef|else|elif|endif|include|pragma)\b")


def roff(text, code=False):
    """Escape text for roff: backslashes, and a line that starts with a
    control character; outside code, `name` in italics."""
    text = text.replace("\\", "\\e")
    if not code:
        text = re.sub(r"`([^`]+)`", r"\\fI\1\\fR", text)
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def comment_lines(block):
    """The text of a C comment block (its lines), without the markers."""
    out = []
    for i, line in enumerate(block):
        s = line.rstrip()
        if i == 0:
            s = re.sub(r"^\s*/\*\*?", "", s)
        if s.endswith("*/"):
            s = s[:-2].rstrip()
        if i > 0:
            s = re.sub(r"^\s*\* ?", "", s, count=1) if re.match(r"^\s*\*", s) else s.strip()
        out.append(s.rstrip() if s.strip() else "")
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return out


def render_text(lines):
    """A comment's text as roff: paragraphs filled, `- ` items as bullets,
    @param and @return as tagged paragraphs, other indented lines kept as
    they are."""
    out = []
    para = []
    mode = None  # None, "pre", "item"

    def flush():
        nonlocal para
        if para:
            out.extend(roff(p.strip()) for p in para)
            para = []

    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        m = re.match(r"^@param(\[[a-z,]+\])?\s+(\w+)\s*(.*)$", stripped)
        if not stripped:
            flush()
            if mode == "pre":
                out.append(".fi")
            mode = None
            out.append(".PP")
            continue
        if m:
            flush()
            if mode == "pre":
                out.append(".fi")
            out.append(".TP")
            way = (m.group(1) or "").strip("[]")
            out.append("\\fI%s\\fR%s" % (m.group(2), " (%s)" % way if way else ""))
            para.append(m.group(3))
            mode = "item"
            continue
        if stripped.startswith("@return"):
            flush()
            if mode == "pre":
                out.append(".fi")
            out.append(".TP")
            out.append("Returns")
            para.append(stripped[len("@return"):].strip())
            mode = "item"
            continue
        b = re.match(r"^(\s*)- (.*)$", line)
        if b:
            flush()
            if mode == "pre":
                out.append(".fi")
            out.append(".IP \\(bu 2")
            para.append(b.group(2))
            mode = "item"
            continue
        if mode == "item" and indent > 0:
            para.append(stripped)
            continue
        if indent >= 2 and mode != "item":
            flush()
            if mode != "pre":
                out.append(".nf")
                mode = "pre"
            out.append(roff(line, code=True))
            continue
        if mode == "pre":
            out.append(".fi")
            mode = None
        if mode == "item" and indent == 0 and re.match(r"^[a-z(]", stripped) is None:
            flush()
            out.append(".PP")
            mode = None
        para.append(stripped)
    flush()
    if mode == "pre":
        out.append(".fi")
    while out and out[-1] == ".PP":
        out.pop()
    while out and out[0] == ".PP":
        out.pop(0)
    return out


protos = {}  # call -> its prototype's lines, as the pages show it


def parse(path):
    """The header as (preamble comment, sections), each section a
    (title, items) and each item a (kind, comment lines, code lines, names)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    file_comment = []
    # The file's own comment first.
    if lines and lines[0].startswith("/*"):
        while i < len(lines):
            file_comment.append(lines[i])
            i += 1
            if file_comment[-1].rstrip().endswith("*/"):
                break
    sections = [("", [])]
    pending = None
    while i < len(lines):
        line = lines[i]
        if re.match(r"^/\* -{10,} \*/\s*$", line) and i + 1 < len(lines):
            title = re.sub(r"^/\*\s*|\s*\*/\s*$", "", lines[i + 1]).strip()
            sections.append((title, []))
            pending = None
            i += 2
            continue
        if not line.strip():
            if pending is not None:
                sections[-1][1].append(("text", comment_lines(pending), [], []))
                pending = None
            i += 1
            continue
        if line.lstrip().startswith("/*"):
            block = [line]
            while not block[-1].rstrip().endswith("*/"):
                i += 1
                block.append(lines[i])
            i += 1
            if pending is not None:
                sections[-1][1].append(("text", comment_lines(pending), [], []))
            pending = block
            continue
        if SKIP_DIRECTIVES.match(line) or line.strip() in ('extern "C" {', "}"):
            i += 1
            continue
        if re.match(r"^#\s*define\s+(GMR_H|GMR_REPLAY_H|GMR_HOOKS_H|GMR_EXTERN)\b", line):
            while lines[i].rstrip().endswith("\\"):
                i += 1
            i += 1
            continue
        # A declaration: up to the end of its statement.
        code = [line]
        if line.startswith("#"):
            while code[-1].rstrip().endswith("\\"):
                i += 1
                code.append(lines[i])
        else:
            depth = line.count("{") - line.count("}") + line.count("(") - line.count(")")
            while depth > 0 or not re.search(r";\s*(/\*.*\*/)?\s*$", code[-1]):
                i += 1
                code.append(lines[i])
                depth += lines[i].count("{") - lines[i].count("}")
                depth += lines[i].count("(") - lines[i].count(")")
        i += 1
        kind = "func" if code[0].startswith("GMR_EXTERN") else "type"
        names = []
        if kind == "func":
            flat = " ".join(c.strip() for c in code)
            m = re.search(r"\b(gmr_\w+)\s*\(", flat)
            names = [m.group(1)]
            code = wrap_proto(re.sub(r"\s+", " ", flat.replace("GMR_EXTERN ", "")).replace("( ", "("))
            protos[names[0]] = code
        else:  # a macro's continuations without their padding
            code = [re.sub(r"\s+\\$", lambda m: " \\", c) for c in code]
        items = sections[-1][1]
        if pending is None and items and items[-1][0] != "text":
            # No comment of its own: shown with the declaration above it.
            k0, c0, code0, names0 = items[-1]
            items[-1] = ("func" if "func" in (k0, kind) else "type", c0, code0 + code, names0 + names)
        else:
            items.append((kind, comment_lines(pending) if pending else [], code, names))
        pending = None
    return comment_lines(file_comment), sections


def wrap_proto(proto, width=78):
    """A prototype over several lines, broken after commas, the rest
    aligned under the first parameter."""
    if len(proto) <= width:
        return [proto]
    open_at = proto.index("(") + 1
    out, cur = [], ""
    for part in re.split(r"(?<=,) ", proto):
        if cur and len(cur) + 1 + len(part) > width:
            out.append(cur)
            cur = " " * open_at + part
        else:
            cur = cur + " " + part if cur else part
    out.append(cur)
    return out


def code_block(lines, bold=()):
    out = [".PP", ".RS 4", ".nf"]
    for line in lines:
        text = roff(line, code=True)
        for name in bold:
            text = re.sub(r"\b(%s)\(" % re.escape(name), r"\\fB\1\\fR(", text, count=1)
        out.append(text)
    out += [".fi", ".RE"]
    return out


def page_text(name, summary, header, version, intro, items, see_also):
    funcs = [n for kind, _, _, names in items if kind == "func" for n in names]
    lines = [".\\\" Generated by man/mkman3.py from include/%s (make update-man);" % header,
             ".\\\" do not edit by hand.",
             '.TH %s 3 "" "gmr %s" "gmr Library Functions"' % (name.upper(), version),
             ".SH NAME"]
    shown = [name] + [f for f in funcs if f != name]
    lines.append("%s \\- %s" % (", ".join(shown), roff(summary)))
    lines += [".SH SYNOPSIS", ".nf", "\\fB#include <%s>\\fR" % header]
    if funcs:
        lines.append(".sp")
        for kind, _, code, names in items:
            for n in names:
                for j, part in enumerate(protos[n]):
                    text = roff(part, code=True)
                    if j == 0:
                        text = re.sub(r"\b(%s)\(" % n, r"\\fB\1\\fR(", text, count=1)
                    lines.append(text)
    lines += [".fi", ".SH DESCRIPTION"]
    if intro:
        lines += render_text(intro)
    for kind, comment, code, names in items:
        if kind == "text":
            lines.append(".PP")
            lines += render_text(comment)
            continue
        lines += code_block(code, bold=names)
        if comment:
            lines.append(".PP")
            lines += render_text(comment)
    errors = [m for _, _, code, _ in items for c in code
              for m in re.findall(r'X\((E[A-Z]+), (\d+), "([^"]*)"\)', c)]
    if errors:
        lines += [".SH ERRORS", "Calls return 0 or one of these codes (GMR_OK is 0):"]
        for name_, value, text in errors:
            lines += [".TP", "\\fBGMR_%s\\fR (\\-%s)" % (name_, value), roff(text)]
    lines += [".SH SEE ALSO", ", ".join("\\fB%s\\fR(%s)" % (p, s) for p, s in see_also if p != name)]
    # No empty lines, no paragraph macro right after another.
    cleaned = []
    for line in lines:
        if line == "" and cleaned and cleaned[-1] in (".nf",):
            continue
        if line == ".PP" and cleaned and cleaned[-1] in (".PP", ".SH DESCRIPTION", ".TP", ".IP \\(bu 2"):
            continue
        if line.startswith(".PP") and cleaned and cleaned[-1].startswith(".SH"):
            continue
        cleaned.append(line if line != "" else ".")
    return "\n".join(cleaned).replace("\n.\n", "\n") + "\n"


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(src, "include", "gmr.h"), encoding="utf-8") as f:
        version = ".".join(re.findall(r"#define GMR_VERSION_(?:MAJOR|MINOR|PATCH) (\d+)", f.read()))
    pages = []  # (name, summary, header, intro, items)
    for header, first in HEADERS:
        intro, sections = parse(os.path.join(src, "include", header))
        # The file comment's first sentence names the header's subject.
        # The file comment's first sentence, without "NAME.h: ", is the summary.
        n = intro.index("") if "" in intro else len(intro)
        first_para = " ".join(l.strip() for l in intro[:n])
        m = re.match(r"^(.*?\.)(?:\s+(.*))?$", first_para)
        summary = re.sub(r"^\S+\.h: ", "", m.group(1) if m else first_para).rstrip(".")
        rest = ([m.group(2)] if m and m.group(2) else []) + intro[n:]
        while rest and not rest[0]:
            rest.pop(0)
        for title, items in sections:
            if not title:
                pages.append((first, summary, header, rest, items))
                continue
            name, text = next(((p, w) for t, p, w in PAGE_OF_SECTION if title.startswith(t)),
                              (None, None))
            if name is None:
                name = "gmr_" + title.split()[0].lower()
                text = re.sub(r"\s*\(docs/[^)]*\)", "", title).rstrip(".")
                text = text[0].lower() + text[1:]
            pages.append((name, text, header, [], items))
    see_also = [(p[0], 3) for p in pages] + [("gmr-compare", 1), ("gmr-config", 5)]
    os.makedirs(out, exist_ok=True)
    written = []
    links = {}
    for name, summary, header, intro, items in pages:
        with open(os.path.join(out, name + ".3"), "w", encoding="utf-8") as f:
            f.write(page_text(name, summary, header, version, intro, items, see_also))
        written.append(name + ".3")
        for kind, _, _, names in items:
            for n in names:
                if n != name:
                    links[n] = name
    for n, target in sorted(links.items()):
        if n + ".3" in written:
            continue
        with open(os.path.join(out, n + ".3"), "w", encoding="utf-8") as f:
            f.write(".so man3/%s.3\n" % target)
    allpages = sorted(written) + sorted(n + ".3" for n in links if n + ".3" not in written)
    with open(os.path.join(out, "pages.am"), "w", encoding="utf-8") as f:
        f.write("# Generated by man/mkman3.py (make update-man): the man 3 pages, one per\n"
                "# group of calls, and one per call that sources its group's.\n")
        f.write("GMR_MAN3_PAGES = \\\n")
        f.write(" \\\n".join("\tman/man3/" + p for p in allpages) + "\n")


if __name__ == "__main__":
    main()
