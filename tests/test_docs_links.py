"""Every link between the project's pages leads somewhere: the file exists, and so does the
heading its ``#anchor`` names (GitHub's slugs). The README links by absolute GitHub address (it is
the package's long description too); those are read as paths of this repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
REPOSITORY = "https://github.com/django-order-timeout/django-order-timeout/"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> list[str]:
    """The page's lines outside fenced and indented code, inline code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not re.match(r"( {4}|\t)(?! *[-*] |\d+\. )", line):
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def targets(page: Path) -> list[tuple[str, Path, str]]:
    """(the link as written, the file it names, its anchor or '') for each link to this repository."""
    found = []
    for line in prose(page.read_text()):
        for link in LINK.findall(line):
            if link.startswith(REPOSITORY):
                path = re.sub(r"^(blob|tree)/[^/]+/", "", link[len(REPOSITORY):])
                file, _, anchor = path.partition("#")
                found.append((link, ROOT / file, anchor))
            elif not re.match(r"[a-z]+:", link):
                file, _, anchor = link.partition("#")
                found.append((link, (page.parent / file).resolve() if file else page, anchor))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_of_a_page_leads_to_a_file_and_a_heading_that_exist(page):
    broken = [link for link, file, anchor in targets(page)
              if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file))]

    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_check_reads_links_and_anchors_as_github_does():
    assert slug("The compensation scan and the prune: the consumers' housekeeping") == \
        "the-compensation-scan-and-the-prune-the-consumers-housekeeping"
    assert slug("One clock: the database's") == "one-clock-the-databases"
    assert slug("`final`: acted on for good") == "final-acted-on-for-good"
    assert slug("3. Reminders before the deadline") == "3-reminders-before-the-deadline"
    assert targets(ROOT / "README.md"), "no link read from the README"
