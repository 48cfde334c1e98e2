#!/usr/bin/env python3
"""Checks the relative links of every tracked Markdown file (git ls-files '*.md').

A link is [text](target), ![alt](target) or a reference definition [label]: target, outside
code blocks and code spans. For each relative target: the file or directory exists (relative to
the linking file; a leading / is the repository root), and a #anchor, when the target is a
Markdown file (or the link is only #anchor), matches a heading's GitHub slug in that file:
lower case, punctuation dropped except '-' and '_', each space a '-', and a repeated heading
gets -1, -2, ... in order. Links with a scheme (http:, https:, mailto:, ...) are skipped.

Prints each broken link as file:line: link and exits 1, else prints one OK line. Standard
library only; run from anywhere inside the repository.
"""
import os
import re
import subprocess
import sys
import urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"""<a\s[^>]*?(?:name|id)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
# A code span: a run of backticks, content without a blank line, the same run again.
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:[^\n]|\n(?![ \t]*\n))+?)(?<!`)\1(?!`)")
# [text](target "title"): the text may hold one level of brackets; the target may be <...> or
# hold balanced parentheses.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]"
    r"\(\s*(<[^>\n]*>|(?:[^\s()\\]|\\.|\([^\s()]*\))*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)"
)
REF_DEF = re.compile(r"^ {0,3}\[(?:[^\]\\]|\\.)+\]:[ \t]*(<[^>\n]*>|\S+)", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def repo_root():
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def tracked_markdown(root):
    out = subprocess.run(["git", "ls-files", "-z", "--", "*.md"], cwd=root, capture_output=True, check=True)
    return sorted(p for p in out.stdout.decode().split("\0") if p)


def blank(match):
    """The matched text with every character but newlines turned into a space."""
    return re.sub(r"[^\n]", " ", match.group(0))


def prose_of(text):
    """The file's text with fenced code blocks and code spans blanked, line numbers kept."""
    lines = text.split("\n")
    fence = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                lines[i] = ""
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            lines[i] = ""
    return CODE_SPAN.sub(blank, "\n".join(lines))


def heading_text(raw):
    """A heading's text as GitHub renders it: links and images as their text, no markup."""
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    t = re.sub(r"<[^>]+>", "", t)
    t = t.replace("`", "")
    t = re.sub(r"(\*{1,3})(\S(?:.*?\S)?)\1", r"\2", t)
    t = re.sub(r"(?<![\w])(_{1,3})(\S(?:.*?\S)?)\1(?![\w])", r"\2", t)
    return t.strip()


def slug(text):
    s = text.lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors_of(path, cache={}):
    if path in cache:
        return cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    titles = []
    fence = None
    previous = ""
    for line in lines:
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            previous = ""
            continue
        if m:
            fence = m.group(1)
            previous = ""
            continue
        h = ATX.match(line)
        if h:
            titles.append(heading_text(h.group(2) or ""))
            previous = ""
            continue
        s = SETEXT.match(line)
        if s and previous.strip() and not previous.startswith("    ") and not ATX.match(previous):
            titles.append(heading_text(previous))
            previous = ""
            continue
        previous = line
    anchors = set()
    seen = {}
    for title in titles:
        base = slug(title)
        n = seen.get(base, 0)
        anchors.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    anchors.update(HTML_ANCHOR.findall(text))
    cache[path] = anchors
    return anchors


def links_of(text):
    """(line number, target) of every link outside code."""
    prose = prose_of(text)
    found = []
    for m in INLINE_LINK.finditer(prose):
        found.append((prose.count("\n", 0, m.start(1)) + 1, m.group(1)))
    for m in REF_DEF.finditer(prose):
        found.append((prose.count("\n", 0, m.start(1)) + 1, m.group(1)))
    return sorted(found)


def check(root, source, target):
    """None if the link resolves, else a reason."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target or SCHEME.match(target):
        return None
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path.split("?", 1)[0])
    anchor = urllib.parse.unquote(anchor)
    if path:
        base = root if path.startswith("/") else os.path.dirname(os.path.join(root, source))
        resolved = os.path.normpath(os.path.join(base, path.lstrip("/")))
        if not (resolved + os.sep).startswith(root + os.sep) and resolved != root:
            return "outside the repository"
        if not os.path.exists(resolved):
            return "no such file"
    else:
        resolved = os.path.join(root, source)
    if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
        if anchor not in anchors_of(resolved):
            return "no heading with this anchor"
    return None


def main():
    root = repo_root()
    broken = []
    count = 0
    files = tracked_markdown(root)
    for source in files:
        with open(os.path.join(root, source), encoding="utf-8") as f:
            text = f.read()
        for line, target in links_of(text):
            count += 1
            reason = check(root, source, target)
            if reason:
                broken.append(f"{source}:{line}: {target} ({reason})")
    if broken:
        print("\n".join(broken))
        print(f"check-links: {len(broken)} broken of {count} links in {len(files)} Markdown files", file=sys.stderr)
        return 1
    print(f"check-links: OK, {count} links in {len(files)} Markdown files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
