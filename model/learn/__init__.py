"""Numbers for the Learn views, each computed from the running model's own weights."""
