"""The chaos harness: fault scenarios against private MariaDB and Redis servers, invariants counted in SQL.

``scripts/chaos [--quick] [--scenarios a,b]``; see ``chaos.__main__``,
``chaos.scenarios`` (one function per scenario) and docs/reliability.md.
"""
