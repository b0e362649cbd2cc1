"""The node agent in device mode: one edge device running its one configuration."""
