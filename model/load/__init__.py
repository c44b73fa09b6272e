"""Load a model (bundled, package, folder or hub id) or wrap one already in memory, and turn text into tokens."""
