"""The database side: row locks by the database's clock, session limits, what an error means, the keyset walk.

Knows nothing of Redis: ``locks`` (the one locking SELECT, lock conflicts
retried), ``session`` (the database's clock, time limits on a session or a
transaction, ending a session), ``errors`` (a lock conflict or a failure),
``walk`` (rows in deadline order, a chunk at a time).
"""
