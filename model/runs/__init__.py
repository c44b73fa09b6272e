"""Keep what a forward captured: the run record, the byte-capped stores of runs and tiles, tiles of any head, the
memory budget, export.
"""
