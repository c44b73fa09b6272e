"""The attention itself, below everything that runs a model: the function registered with transformers
(``interface``: the capture point, fused kernel or blocks), the masks as key ranges (``spans``) and what
a run keeps of one layer, any weight rebuilt from it (``kept``)."""
