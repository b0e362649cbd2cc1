"""Staging: a worker's data fetched onto the node before it runs, its output put where the
job says after it ends (registry.py; the inputs and outputs steps use it)."""
