"""The previous release, as the upgrade tests run it: its commit (``releases.toml``), its
migrations (read from git) and its own virtual environment.

The environment is ``.venv-release-<version>/`` at the top of the checkout (git ignores it): the
release's tree from ``git archive`` in ``src/``, and its declared dependencies (its
``pyproject.toml``: the app's, the database drivers, dj-database-url for its test project)
installed at the versions this environment runs, so both releases meet the same Django and
drivers, as in a shop that upgrades the app alone. Built once, under a lock, and stamped with
what it was built from; a stamp that no longer matches builds it again.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LAST_RELEASE = PROJECT_ROOT / "scripts" / "last-release"
# The extras a shop on MariaDB or PostgreSQL installs, and what the release's test project reads.
EXTRAS = ("mysql", "postgresql")
TEST_PROJECT_NEEDS = ("dj-database-url",)
MIGRATION = re.compile(r"^(\d{4}_\w+)\.py$")


@dataclass(frozen=True)
class Release:
    version: str
    commit: str

    def migrations(self, app: str = "order_timeout") -> list[str]:
        """The names of ``app``'s migrations in this release, in order (from git, not a checkout)."""
        listing = git("ls-tree", "--name-only", f"{self.commit}:{app}/migrations/")
        return sorted(match[1] for name in listing.split() if (match := MIGRATION.match(name)))

    def last_migration(self, app: str = "order_timeout") -> str:
        return self.migrations(app)[-1]


@dataclass(frozen=True)
class ReleaseEnvironment:
    """A release's tree and the virtual environment that runs it."""

    release: Release
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def tree(self) -> Path:
        return self.root / "src"

    @property
    def manage(self) -> Path:
        return self.tree / "manage.py"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], check=True, capture_output=True,
                          text=True).stdout


def previous_release() -> Release:
    """The newest release ``releases.toml`` lists below the version in ``pyproject.toml``: what
    ``scripts/last-release`` names for CI's comparisons, read by its own code."""
    version, commit = runpy.run_path(str(LAST_RELEASE))["last_release"](PROJECT_ROOT)
    return Release(str(version), commit)


def requirements(release: Release) -> list[str]:
    """What the release declares a shop installs (with ``EXTRAS``), pinned to this environment's
    versions where it has them, plus what its test project needs."""
    project = tomllib.loads(git("show", f"{release.commit}:pyproject.toml"))["project"]
    extras = [need for extra in EXTRAS for need in project["optional-dependencies"][extra]]
    declared = [*project["dependencies"], *extras, *TEST_PROJECT_NEEDS]
    return [pinned(Requirement(text)) for text in declared]


def pinned(requirement: Requirement) -> str:
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    try:
        return f"{requirement.name}{extras}=={version(requirement.name)}"
    except PackageNotFoundError:
        return str(requirement)


def environment(release: Release) -> ReleaseEnvironment:
    """The release's environment, built if it is missing or was built from something else."""
    built = ReleaseEnvironment(release, PROJECT_ROOT / f".venv-release-{release.version}")
    built.root.mkdir(exist_ok=True)
    with open(built.root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once: one builds, the other waits
        stamp, wanted = built.root / "stamp.json", _stamp_for(release)
        if not stamp.exists() or json.loads(stamp.read_text()) != wanted:
            _build(built)
            stamp.write_text(json.dumps(wanted, indent=1))
    return built


def _stamp_for(release: Release) -> dict[str, object]:
    return {"commit": release.commit, "python": sys.version, "requirements": requirements(release)}


def _build(built: ReleaseEnvironment) -> None:
    for entry in built.root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.name != ".lock":
            entry.unlink()
    archive = subprocess.run(["git", "-C", str(PROJECT_ROOT), "archive", "--format=tar", built.release.commit],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(built.tree, filter="data")
    subprocess.run([sys.executable, "-m", "venv", str(built.root)], check=True, capture_output=True)
    pip = subprocess.run([str(built.python), "-m", "pip", "install", "--quiet", *requirements(built.release)],
                         capture_output=True, text=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if pip.returncode:
        raise RuntimeError(f"pip could not install {built.release.version}'s dependencies:\n{pip.stderr}")
