"""The soak: a steady stream of orders for a given time, to see whether what the app keeps stays flat.

``scripts/chaos --soak SECONDS [--database mariadb|postgresql]`` (or ``python -m chaos.soak``).
On the fault runs' private servers (a MariaDB or a PostgreSQL, and a Redis, on free loopback
ports) it runs a shop's day, shortened: orders at a steady rate, each with a reminder and a
webhook notice at its close, a fifth paid before the deadline and a few at it, 1 % whose close
fails for good until staff fix the shop and requeue them or close them now; three consumers, one
SIGKILLed and one SIGTERMed on a schedule and restarted (one never, for its memory); the beat's
task (the scan, and the prune) with short ages. Every ``--sample-every`` seconds it samples
every app table, every Redis key pattern, each consumer's memory and the connections, fits each
series' growth per 1,000 orders over the second half, and says which are flat. It exits 1 when
a correctness invariant fails, never for a timing nor for a series that grows: that is reported.

``plan`` (its settings), ``stream`` (orders and payments), ``staff`` (the dead letters),
``sampling`` with ``tables``, ``keyspace`` and ``memory`` (what a sample reads), ``fit`` (the
slopes), ``checks`` (the invariants), ``target`` (the webhook's far end), ``report`` and ``run``.
"""
