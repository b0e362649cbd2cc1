"""One worker: its spec and directory, the manager that starts, watches and reports it, and
the step pipeline it runs through."""
