"""Every per-architecture fact in one place: the family table, Q/K readers for the families outside
AttentionInterface, config aliases, value layouts and W_O slicing.
"""
