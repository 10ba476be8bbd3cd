"""Every relative link in README.md and docs/*.md leads somewhere.

A link to a file must name a file or folder of the repository, and a link
with an ``#anchor`` must name a heading of the page it points to (GitHub's
slug rule: lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2``
... for repeats). External links (``http:``, ``https:``, ``mailto:``) are not
followed. Links inside code spans and fenced code blocks are not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# A fence opens with 3+ backticks (an info string without backticks) or 3+
# tildes, and closes with at least as many of the same character.
FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}(?=[^`]*$)|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the target ends at the first space or ')'.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, code spans blanked."""
    lines, fence = [], ""
    for line in text.splitlines():
        if fence:
            if re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", line):
                fence = ""
            lines.append("")
            continue
        m = FENCE_OPEN.match(line)
        if m:
            fence = m.group(1)
            lines.append("")
            continue
        lines.append(CODE_SPAN.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for line in _prose_lines(page.read_text()) for m in LINK.finditer(line)]


def _broken(page: Path, root: Path = ROOT) -> list[str]:
    def rel(p: Path) -> str:
        return str(p.relative_to(root))

    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page.resolve()
        if dest != root and root not in dest.parents:
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file {rel(dest)}")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    return broken


def test_slug_follows_github() -> None:
    assert slug("vLLM's own offloading and LMCache 0.5 under Continuum") == \
        "vllms-own-offloading-and-lmcache-05-under-continuum"
    assert slug("Unchanged agents in the A/B runner (AMD EPYC, AVX2 only, fp32)") == \
        "unchanged-agents-in-the-ab-runner-amd-epyc-avx2-only-fp32"
    assert slug("Set-up: two commands on a fresh machine") == "set-up-two-commands-on-a-fresh-machine"
    assert slug("Glossary: the words for \"job\"") == "glossary-the-words-for-job"


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](#nowhere) `[code](x.md)`\n"
                    "```\n[fenced](y.md)\n```\n[web](https://example.com)\n"
                    "```` ```py ```` is a code span, not a fence [after](#title)\n")
    assert anchors(page) == {"title"}
    assert links(page) == ["#title", "missing.md", "#nowhere", "https://example.com", "#title"]
    assert _broken(page, tmp_path.resolve()) == ["missing.md: no such file missing.md",
                                                  "#nowhere: no heading #nowhere in page.md"]


def test_readme_links_every_doc() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md") if not t.startswith("#")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert _broken(page) == []
