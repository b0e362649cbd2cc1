"""What a worker needs before it runs and gives back after it ends, one step per concern
(base.py says what a step is)."""
