"""Capture one forward (or a generation, step by step): the attention-interface capture point, masks and spans,
activation names, and the one temporary-hooks mechanism.
"""
