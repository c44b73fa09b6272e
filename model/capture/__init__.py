"""Capture one forward (or a generation, step by step): activations by name, each layer's attention as it
passes the capture point (told to a listener: the live scores), and the one temporary-hooks mechanism.
"""
