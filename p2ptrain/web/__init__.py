"""The read-only web dashboard of a node (`--http`): the page (static/), its JSON (server.py),
the run's history of points and events (history.py) and Prometheus metrics (metrics.py).
Stdlib http.server and prometheus_client; it reads status documents (records), nothing else."""
