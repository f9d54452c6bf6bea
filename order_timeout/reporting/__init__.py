"""How the timers are doing, for people and machines: ``health`` (the figures, computed once),
``overview`` (the admin page's), ``metrics`` (Prometheus)."""
