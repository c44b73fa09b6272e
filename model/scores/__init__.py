"""Scores computed from what a run keeps: head scores (block and fused paths, late scores), predictions, logit
lens, sparsity, probes.
"""
