"""The node's HTTP proxy to the endpoints it serves (README, "Endpoints: the proxy and its
trust model")."""
