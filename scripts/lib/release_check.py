"""What scripts/release-check asks of Python: what the sdist and the wheel must hold, and the
README's install command, settings block and commands, read by tests/readme.py (the reader
tests/test_readme_commands.py uses), so CI pastes exactly what a shop reads.

    python scripts/lib/release_check.py contents DIST_DIR          # fails, naming each file, on a wrong sdist or wheel
    python scripts/lib/release_check.py readme-shell               # the README's commands, for eval
    python scripts/lib/release_check.py readme-shell DATABASE      # its pip line and servers on DATABASE, for eval
    python scripts/lib/release_check.py readme-settings DATABASE   # its settings block on DATABASE, to paste

DATABASE is ``mariadb`` (the README's lines as written) or ``postgresql`` (the same lines with
only what must differ changed: ``ON_POSTGRESQL``).

Run with the project's virtualenv (it needs ``packaging``), from anywhere.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.readme import readme_commands, readme_python_blocks  # noqa: E402

PACKAGE = "order_timeout"
SECTION = "Use it in your project"
SETTINGS_BLOCK = "# shop/settings.py"
# The Django backend each pass of the check runs on; its last part is Django's connection.vendor.
ENGINES = {"mariadb": "django.db.backends.mysql", "postgresql": "django.db.backends.postgresql"}
# The README's settings block is MariaDB's; on PostgreSQL these lines of it change, each found
# exactly once, and no other: the ENGINE its own comment names, PostgreSQL's port, and no MySQL
# charset option (psycopg refuses a connection option it does not know: "invalid connection
# option").
ON_POSTGRESQL = (
    (r'"django\.db\.backends\.mysql",\s*# or ("django\.db\.backends\.postgresql")$', r"\1,"),
    (r'"PORT": "3306"', '"PORT": "5432"'),
    (r'^ *"OPTIONS": \{"charset": "utf8mb4"\},.*\n', ""),
)
# In the repository, not in a release: the wheel holds the package alone, the sdist the package
# and what describes it (MANIFEST.in).
NOT_SHIPPED = ("tests", "testproject", "bench", "chaos", "docs", "scripts", ".ci", "manage.py", "releases.toml")
SDIST_EXTRAS = ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "PKG-INFO")
# One of each kind of data file, named, so the check cannot pass on an empty `git ls-files`.
KINDS = {
    "a Lua script": r"^order_timeout/queue/lua/claim\.lua$",
    "a shared Lua part": r"^order_timeout/queue/lua/lib/[^/]+\.lua$",
    "a migration": r"^order_timeout/migrations/0001_initial\.py$",
    "the admin template": r"^order_timeout/templates/admin/order_timeout/[^/]+\.html$",
    "a compiled catalogue (.mo)": r"^order_timeout/locale/[^/]+/LC_MESSAGES/django\.mo$",
    "a catalogue's source (.po)": r"^order_timeout/locale/[^/]+/LC_MESSAGES/django\.po$",
    "py.typed (PEP 561)": r"^order_timeout/py\.typed$",
    "a management command": r"^order_timeout/management/commands/run_timeout_consumer\.py$",
}


def project_version() -> str:
    """The version pyproject.toml declares: the one place it is written."""
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def distribution_name() -> str:
    """The file-name form of the project's name (``django_order_timeout``)."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    return canonicalize_name(name).replace("-", "_")


def wheel_name() -> str:
    return f"{distribution_name()}-{project_version()}-py3-none-any.whl"


def tracked_package_files() -> set[str]:
    """Every file of the package in git: each must ship, whatever its kind (a new Lua script, a
    new catalogue), with no list here to keep up to date."""
    listed = subprocess.run(["git", "ls-files", "-z", PACKAGE], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    return {path for path in listed.split("\0") if path}


def missing_and_extra(names: set[str], prefix: str = "") -> list[str]:
    """Problems common to both archives: a package file or a kind of data file missing, or a
    part of the repository that is not the package shipped."""
    inside = {name.removeprefix(prefix) for name in names if name.startswith(prefix)}
    problems = [f"missing {path}" for path in sorted(tracked_package_files() - inside)]
    problems += [f"missing {kind} ({pattern})" for kind, pattern in KINDS.items()
                 if not any(re.search(pattern, name) for name in inside)]
    problems += [f"holds {name}" for name in sorted(inside)
                 if name.split("/")[0] in NOT_SHIPPED or "__pycache__" in name or name.endswith(".pyc")]
    return problems


def check_wheel(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as wheel:
        names = {name for name in wheel.namelist() if not name.endswith("/")}
        dist_info = f"{distribution_name()}-{project_version()}.dist-info"
        metadata = wheel.read(f"{dist_info}/METADATA").decode() if f"{dist_info}/METADATA" in names else ""
    problems = missing_and_extra(names)
    tops = {name.split("/")[0] for name in names}
    problems += [f"holds {top}/ beside the package" for top in sorted(tops - {PACKAGE, dist_info})]
    if f"{dist_info}/licenses/LICENSE" not in names:
        problems.append(f"missing {dist_info}/licenses/LICENSE")
    if f"\nVersion: {project_version()}\n" not in metadata:
        problems.append(f"its METADATA does not say Version: {project_version()}")
    problems += [f"its METADATA has no extra {extra!r}" for extra in ("mysql", "postgresql", "celery", "metrics")
                 if f"\nProvides-Extra: {extra}\n" not in metadata]
    return problems


def check_sdist(path: Path) -> list[str]:
    with tarfile.open(path) as sdist:
        names = {member.name for member in sdist.getmembers() if member.isfile()}
    prefix = f"{distribution_name()}-{project_version()}/"
    problems = missing_and_extra(names, prefix)
    problems += [f"missing {name}" for name in SDIST_EXTRAS if prefix + name not in names]
    problems += [f"holds {name} outside {prefix}" for name in sorted(names) if not name.startswith(prefix)]
    return problems


def contents(dist: Path) -> int:
    """Check the one sdist and the one wheel in ``dist``; print what was checked or each problem."""
    expected = {dist / wheel_name(): check_wheel,
                dist / f"{distribution_name()}-{project_version()}.tar.gz": check_sdist}
    found = sorted(path.name for path in dist.iterdir())
    if sorted(path.name for path in expected) != found:
        print(f"{dist} holds {found}, not the sdist and wheel of {project_version()}", file=sys.stderr)
        return 1
    status = 0
    for path, check in expected.items():
        if problems := check(path):
            status = 1
            print(f"{path.name}:", *problems, sep="\n  ", file=sys.stderr)
        else:
            print(f"{path.name}: every file of the package in git, LICENSE, no tests/testproject/bench/chaos/docs")
    return status


def on_postgresql(block: str) -> str:
    """The README's settings block with ``ON_POSTGRESQL``'s lines changed, every other as written."""
    for pattern, replacement in ON_POSTGRESQL:
        block, found = re.subn(pattern, replacement, block, flags=re.M)
        if found != 1:
            raise SystemExit(f"README.md's {SETTINGS_BLOCK} block: {pattern!r} found {found} times, not once")
    return block


def readme_settings(database: str) -> str:
    block = readme_python_blocks()[SETTINGS_BLOCK]
    return on_postgresql(block) if database == "postgresql" else block


def readme_install(database: str) -> str:
    install = next(command for command in readme_commands(SECTION) if command.startswith("pip install "))
    return with_postgresql_extra(install) if database == "postgresql" else install


def with_postgresql_extra(install: str) -> str:
    """The README's pip line with the ``postgresql`` extra in place of ``mysql``, the rest as written."""
    found = re.fullmatch(r"[^\[]+\[([\w,-]+)\]", shlex.split(install)[-1])
    extras = found.group(1) if found else ""
    if "mysql" not in extras.split(","):
        raise SystemExit(f"README.md's pip line has no mysql extra to replace: {install}")
    postgresql = ",".join("postgresql" if name == "mysql" else name for name in extras.split(","))
    return install.replace(f"[{extras}]", f"[{postgresql}]")


def shell(values: dict[str, Any]) -> str:
    return "".join(f"{key}={shlex.quote(str(value))}\n" for key, value in values.items())


def readme_shell() -> str:
    """The README's migrate, check and consumer commands, as shell assignments.

    Fails when the README's pip command does not install this version's wheel: the README and
    the version are bumped together (CONTRIBUTING.md, "Making a release")."""
    commands = readme_commands(SECTION)
    [migrate] = [command for command in commands if command.split()[:3] == ["python", "manage.py", "migrate"]]
    [check] = [command for command in commands if command.split()[:3] == ["python", "manage.py", "check"]]
    [consume] = [command for command in commands if "run_timeout_consumer" in command]
    install = readme_install("mariadb")
    wheel = Path(shlex.split(install)[-1].split("[")[0]).name
    if wheel != wheel_name():
        raise SystemExit(f"README.md installs {wheel}, but pyproject.toml's version makes {wheel_name()}: "
                         f"change the README's command ({install})")
    return shell({"version": project_version(), "wheel": wheel, "migrate": migrate, "check": check,
                  "consume": consume})


def database_shell(database: str) -> str:
    """The README's pip line and the servers its settings block names on ``database``, as shell
    assignments (``vendor`` is what Django's connection.vendor must say)."""
    namespace: dict[str, Any] = {"INSTALLED_APPS": []}
    exec(readme_settings(database), namespace)  # the README's own lines: dicts and a sum, nothing imported
    settings = namespace["DATABASES"]["default"]
    if settings["ENGINE"] != ENGINES[database]:
        raise SystemExit(f"the README's settings use {settings['ENGINE']}; this check's {database} pass needs "
                         f"{ENGINES[database]}")
    values = {
        "install": readme_install(database),
        "vendor": settings["ENGINE"].rsplit(".", 1)[1], "db_name": settings["NAME"], "db_user": settings["USER"],
        "db_password": settings["PASSWORD"], "db_host": settings["HOST"], "db_port": settings["PORT"],
        "redis_url": namespace["CACHES"][namespace["ORDER_TIMEOUT"]["REDIS_ALIAS"]]["LOCATION"],
    }
    for key in ("db_name", "db_user", "db_password"):  # written into SQL by the script
        if not re.fullmatch(r"[A-Za-z0-9_-]+", values[key]):
            raise SystemExit(f"the README's {key} {values[key]!r}: the check quotes only [A-Za-z0-9_-]")
    return shell(values)


def main(argv: list[str]) -> int:
    match argv:
        case ["contents", dist]:
            return contents(Path(dist))
        case ["readme-shell"]:
            print(readme_shell(), end="")
            return 0
        case ["readme-shell", database] if database in ENGINES:
            print(database_shell(database), end="")
            return 0
        case ["readme-settings", database] if database in ENGINES:
            print(readme_settings(database), end="")
            return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
