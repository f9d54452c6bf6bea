"""The README's code and commands, read from README.md itself: one reader for the tests that
paste them into a new project and for CI's release stage (scripts/release-check), which pastes
them beside the installed wheel. The commands the README hands over to a page of docs/ (the
status command, the consumer's metrics port: docs/operations.md) are read from that page the
same way. Standard library only, so CI can read the README with no Django set up."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README_PATH = Path(__file__).resolve().parent.parent / "README.md"
README = README_PATH.read_text()
DOCS = README_PATH.parent / "docs"


def docs_page(name: str) -> str:
    """The text of ``docs/<name>``."""
    return (DOCS / name).read_text()


def readme_command(pattern: str, readme: str = README) -> list[str]:
    """The one indented command line of the README (or of another page's text) that matches
    ``pattern``, as arguments; its optional part (from the first ``[...]``) left out."""
    found = [line.strip() for line in readme.splitlines()
             if line.startswith("    ") and re.search(pattern, line)]
    assert len(found) == 1, f"commands matching {pattern!r}: {found}"
    return shlex.split(found[0].split("#")[0].split(" [")[0])


def readme_python_blocks(readme: str = README) -> dict[str, str]:
    """The README's fenced Python blocks, by their first line (a ``# where it goes`` comment)."""
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    return {block.splitlines()[0]: block for block in blocks}


def readme_commands(section: str, readme: str = README) -> list[str]:
    """The indented command lines of one README section (``## section``, up to its first
    subsection), comments dropped."""
    text = re.split(r"\n#{2,3} ", readme.split(f"## {section}\n", 1)[1], maxsplit=1)[0]
    return [line.strip().split("  #")[0].strip() for line in text.splitlines()
            if re.match(r"    (python|celery|pip) ", line)]
