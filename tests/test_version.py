"""One version everywhere a shop reads it.

The version is written once, in pyproject.toml; CHANGELOG.md's newest heading, the installed
package's metadata and the README's install command must say the same, or a shop pinning a
version cannot tell one release's behaviour from another's. (The built sdist and wheel
themselves: scripts/release-check, a CI stage.)
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from datetime import date
from pathlib import Path

from packaging.version import Version

from .readme import readme_commands

ROOT = Path(__file__).resolve().parent.parent
MAKING = Version(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def newest_changelog_heading() -> tuple[str, str]:
    """(version, what the parentheses say) of CHANGELOG.md's first ``## `` heading."""
    heading = re.search(r"^## (\S+) \((.+)\)$", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert heading, "CHANGELOG.md has no '## VERSION (DATE or unreleased)' heading"
    return heading.group(1), heading.group(2)


def test_the_changelogs_newest_heading_is_the_version_pyproject_makes_dated_once_released():
    version, when = newest_changelog_heading()

    if MAKING.is_devrelease:  # 0.4.0.dev0 is written up under "0.4.0 (unreleased)"
        assert (Version(version), when) == (Version(MAKING.base_version), "unreleased")
    else:
        assert Version(version) == MAKING
        assert date.fromisoformat(when), f"a release's heading is dated (YYYY-MM-DD), not {when!r}"


def test_the_installed_package_reports_the_version_pyproject_declares():
    installed = importlib.metadata.version("django-order-timeout")

    assert Version(installed) == MAKING, (
        f"the installed metadata says {installed}, pyproject.toml {MAKING}: reinstall the project "
        "(scripts/test does when pyproject.toml changes)")


def test_the_readmes_install_command_installs_this_versions_wheel():
    [install] = [command for command in readme_commands("Use it in your project") if command.startswith("pip ")]

    assert install == f'pip install "./django_order_timeout-{MAKING}-py3-none-any.whl[mysql,celery,metrics]"'
