"""The typed, keyword-only services both front doors call (HTTP routes and the Python API): each validates its
ranges, takes the model lock and the memory budget, and returns typed results.
"""
