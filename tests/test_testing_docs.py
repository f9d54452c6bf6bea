"""docs/testing.md shows the shops' own test modules as they are: each Python block names its file
on its first line and is found in it as written, so the examples run, as written, wherever the
suite runs those modules (tests/test_shop_test_modules.py)."""

from __future__ import annotations

import re

from .conftest import PROJECT_ROOT

TESTING_MD = PROJECT_ROOT / "docs" / "testing.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def file_blocks() -> list[tuple[str, str]]:
    """``(path, code)`` of each block whose first line is ``# <path>``."""
    found = []
    for block in BLOCK.findall(TESTING_MD.read_text()):
        first, _, code = block.partition("\n")
        if first.startswith("# ") and first.endswith(".py"):
            found.append((first[2:], code))
    return found


def test_every_example_on_the_testing_page_is_in_a_shops_test_module_as_written():
    blocks = file_blocks()
    assert len(blocks) >= 8
    for path, code in blocks:
        source = (PROJECT_ROOT / path).read_text()
        assert code in source, f"docs/testing.md's block of {path} is not in it as written:\n{code}"


def test_every_shops_module_the_page_shows_is_one_the_suite_runs():
    from .test_shop_test_modules import SHOP_MODULES

    for path, _code in file_blocks():
        assert any(path.startswith(module) for module in SHOP_MODULES), path


def test_the_page_names_every_public_name_of_the_kit():
    import order_timeout.testing as kit

    page = TESTING_MD.read_text()
    for name in kit.__all__:
        if name not in ("Ran", "TimersClock", "tell_redis_now"):
            assert f"`{name}" in page, name
