"""Fixtures of the podman runtime's tests (podman_support.py): `image`, `minion`."""

from .podman_support import image, minion  # noqa: F401  (fixtures)
