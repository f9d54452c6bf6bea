"""docs/design.md's "One batch, one page" matches the code: every module, class, method, function and
test it names exists where it says (a rename that forgets the page fails here)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict

from .conftest import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "order_timeout"
SECTION = "### One batch, one page"


def the_page() -> str:
    text = (PROJECT_ROOT / "docs" / "design.md").read_text()
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def definitions() -> tuple[dict[str, set[str]], dict[str, set[str]], set[str]]:
    """(names each module defines at its top, by its file's stem and path; members of each class, by
    its name; every test function's name)."""
    by_module: dict[str, set[str]] = defaultdict(set)
    members: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {target.id for target in targets if isinstance(target, ast.Name)}
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.ClassDef)):
                        members[node.name].add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members[node.name].add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        members[node.name] |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        relative = path.relative_to(PACKAGE).as_posix()
        by_module[relative] |= names
        by_module[path.stem] |= names
    tests = {node.name for path in (PROJECT_ROOT / "tests").glob("test_*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
    return by_module, members, tests


def test_every_name_on_the_page_is_in_the_code():
    by_module, members, tests = definitions()
    missing = []
    for name in sorted(set(re.findall(r"`([^`]+)`", the_page()))):
        name = name.removesuffix("()").split("(")[0]
        if re.fullmatch(r"[\w/]+\.py(: \w+)?", name):
            path, _, defined = name.partition(": ")
            exists = (PACKAGE / path).exists() or (PROJECT_ROOT / path).exists()
            if not exists or (defined and defined not in by_module[path]):
                missing.append(name)
        elif re.fullmatch(r"test_\w+", name):
            if name not in tests:
                missing.append(name)
        elif re.fullmatch(r"_?[A-Z]\w*\.\w+", name):
            owner, member = name.split(".")
            # A dataclass's field counts as its member; a Report's timing, say.
            if member not in members[owner]:
                missing.append(name)
        elif re.fullmatch(r"\w+\.\w+", name) and name.split(".")[0] in by_module:
            module, defined = name.split(".")
            if defined not in by_module[module]:
                missing.append(name)
    assert missing == []


def test_the_page_names_the_ladder_and_the_door():
    page = the_page()
    for name in ("_Ladder.climb", "all_at_once", "the_refused_apart", "a_savepoint_each", "one_key_at_a_time",
                 "Consumer.process", "Report.timing"):
        assert f"`{name}" in page
