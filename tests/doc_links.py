#!/usr/bin/env python3
"""Every relative link of the project's Markdown files resolves: the file
exists and, for a link into a Markdown file, the anchor names one of its
headings (GitHub's rule: lower case, punctuation dropped, spaces to hyphens,
-1, -2, ... for repeats).

    doc_links.py ROOT     exit 0: every link resolves; 1: one or more do not
"""
import os
import re
import sys

SKIP_DIRS = {".git", ".session", ".peers", ".whl", "node_modules"}  # (and build*)


def markdown_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(d, f)


def without_code(text):
    """The text less its fenced code blocks (their # lines are not headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading):
    h = re.sub(r"<[^>]+>", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    with open(path, encoding="utf-8") as f:
        text = without_code(f.read())
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, -1) + 1
        seen[s] = n
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip())
        return 2
    root = os.path.abspath(argv[1])
    files = sorted(markdown_files(root))
    cache, bad, links = {}, 0, 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = without_code(f.read())
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            url = m.group(1)
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", url):  # http:, https:, mailto: ...
                continue
            links += 1
            target, _, frag = url.partition("#")
            tpath = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
            where = os.path.relpath(path, root)
            if not os.path.exists(tpath):
                print(f"{where}: {url}: no such file")
                bad += 1
            elif frag and tpath.endswith(".md"):
                if tpath not in cache:
                    cache[tpath] = anchors(tpath)
                if frag not in cache[tpath]:
                    print(f"{where}: {url}: no heading with that anchor")
                    bad += 1
    print(f"doc_links: {links} relative links in {len(files)} Markdown files, {bad} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
