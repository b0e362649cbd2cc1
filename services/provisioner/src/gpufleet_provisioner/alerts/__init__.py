"""Alert rules and alerts (R-OPS-1): the pure rules (rules.py, states.py, builtin.py,
views.py), the stored ones (book.py), their evaluation against Prometheus (evaluation.py,
prometheus.py) and the requests about them (requests.py)."""
