"""The scans: what the database heals when Redis cannot, and the bulk changes an adoption needs.

``compensation`` (close what Redis lost, rebuild what it forgot, every kind),
``backfill`` (deadlines for old rows), ``reshard`` (members into a new
``SHARDS`` layout).
"""
