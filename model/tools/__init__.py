"""Causal tools: ablate heads, patch activations, attribute a logit to components; the shared intervention machinery."""
