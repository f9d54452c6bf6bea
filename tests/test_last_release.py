"""CI's "last release", read from releases.toml by scripts/last-release.

The last release is the newest version listed there below the version pyproject.toml is
making. CI compares with its commit, so the script must fail loudly, saying why, rather than
let a comparison fall back to some other commit.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Two commits this repository holds: 0.2.0's, and one made after it.
COMMIT_0_2 = "165817b05c14965b6d9a44253ed239d963266dd6"
COMMIT_LATER = "4d25cfb9c9133cd9b724b4d0b881fe4a7b559c4b"


def last_release(root: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "last-release"), "--root", str(root), *arguments],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def project(tmp_path: Path):
    """A folder with a pyproject.toml and a releases.toml, written by the test."""

    def write(making: str, releases: dict[str, str] | None) -> Path:
        (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\nversion = "{making}"\n')
        if releases is not None:
            listed = "".join(f'"{version}" = "{commit}"\n' for version, commit in releases.items())
            (tmp_path / "releases.toml").write_text(f"[releases]\n{listed}")
        return tmp_path

    return write


def test_the_last_release_is_the_newest_listed_below_the_version_being_made(project):
    root = project("0.3.0", {"0.2.0": COMMIT_0_2})

    found = last_release(root)

    assert (found.returncode, found.stdout) == (0, f"{COMMIT_0_2}\n"), found.stderr
    assert last_release(root, "--version").stdout == "0.2.0\n"


def test_a_release_listed_before_the_version_moves_on_is_not_yet_the_last_one(project):
    root = project("0.3.0", {"0.2.0": COMMIT_0_2, "0.3.0": COMMIT_LATER})

    assert last_release(root).stdout == f"{COMMIT_0_2}\n"


def test_once_the_version_moves_on_to_a_dev_release_the_one_listed_last_is_the_last_release(project):
    root = project("0.4.0.dev0", {"0.3.0": COMMIT_LATER, "0.2.0": COMMIT_0_2, "0.10.0": COMMIT_LATER})

    assert last_release(root, "--version").stdout == "0.3.0\n"  # by version, not by text or order
    assert last_release(root).stdout == f"{COMMIT_LATER}\n"


def test_a_missing_releases_file_fails_loudly(project):
    root = project("0.3.0", None)

    found = last_release(root)

    assert found.returncode == 1 and found.stdout == ""
    assert "releases.toml is missing" in found.stderr


def test_a_releases_file_naming_no_older_release_fails_loudly(project):
    root = project("0.2.0", {"0.2.0": COMMIT_0_2, "0.3.0": COMMIT_LATER})

    found = last_release(root)

    assert found.returncode == 1 and found.stdout == ""
    assert "no release older than 0.2.0" in found.stderr


def test_a_commit_this_repository_does_not_hold_fails_loudly(project):
    for commit in ("0" * 40, COMMIT_0_2[:7]):  # unknown; abbreviated (a full hash is asked for)
        found = last_release(project("0.3.0", {"0.2.0": commit}))

        assert found.returncode == 1 and found.stdout == "", commit
        assert "does not hold as a full commit hash" in found.stderr


def test_this_repositorys_last_release_is_one_releases_toml_lists():
    listed = tomllib.loads((ROOT / "releases.toml").read_text())["releases"]

    found = last_release(ROOT)

    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() in listed.values()
