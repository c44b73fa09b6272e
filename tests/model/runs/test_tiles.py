"""The fast tile path (``model.tiles.head_tile``: masks read as one key range a row, logit - lse
pooled before the exp) against the general path (mask rows evaluated, weights pooled) and against
the models' own ``output_attentions``, on every family: causal, sliding windows, soft-capping,
ALiBi, grouped K/V heads, bidirectional encoders, local windows. Masks that are not one range a
row (or that only look like a known one) take the general path."""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import and_masks, causal_mask_function

from attnscope.model.attention.interface import LazyMask
from attnscope.model.attention.kept import LayerAttention, build
from attnscope.model.attention.spans import mask_spans
from attnscope.model.runs.tiles import TileSpec, head_tile, tile
from tests.model.test_families import N, built
from tests.support.families import FAMILIES, Family

SPECS = [TileSpec(0, N, 0, N, None, "max"), TileSpec(0, N, 0, N, 5, "max"), TileSpec(0, N, 0, N, 5, "mean"),
         TileSpec(3, 14, 1, 12, 4, "max"), TileSpec(3, 14, 1, 12, 4, "mean"), TileSpec(9, 16, 0, 7, 3, "mean"),
         TileSpec(2, 11, 4, 15, None, "mean"), TileSpec(0, N, 0, N, 2, "max")]


def _general(layer: LayerAttention, head: int, spec: TileSpec) -> torch.Tensor:
    return tile(lambda a, b: layer.rows(head, a, b, spec.k0, spec.k1), spec)


def _same(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> None:
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got.nan_to_num(-1.0), want.nan_to_num(-1.0), atol=atol, rtol=0)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.id)
def test_fast_tiles_equal_the_general_path_and_the_models_attention(family: Family) -> None:
    b = built(family)
    for i, layer in enumerate(b.acts.layers):
        ranges = layer.spans()
        assert ranges is not None, f"layer {i}: every family's mask is one key range a row"
        assert torch.equal(ranges.visible(0, N, 0, N), layer.visible(0, N, 0, N))
        want = b.ref.attentions[i][0].float()  # (H, N, N) the model's own eager weights
        for head in sorted({0, layer.n_heads - 1}):  # two K/V groups where there are two
            for j, spec in enumerate(SPECS):
                general = _general(layer, head, spec)
                # one block; and for a few, one row a block and blocks that split bins
                for budget in (1 << 20,) if j % 3 else (1, 23, 1 << 20):
                    _same(head_tile(layer, head, spec, budget), general)
            exact = head_tile(layer, head, TileSpec(0, N, 0, N, None, "max"))
            hidden = ~layer.visible(0, N, 0, N)
            torch.testing.assert_close(exact.nan_to_num(0.0), want[head].masked_fill(hidden, 0.0), atol=1e-5, rtol=0)


def _layer(n: int, mask: LazyMask, seed: int = 0) -> LayerAttention:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(4, n, 8, generator=gen), torch.randn(2, n, 8, generator=gen)
    return build(q, k, scaling=0.5, softcap=None, groups=2, bias=None, mask=mask)


def test_a_mask_that_is_not_one_range_a_row_takes_the_general_path() -> None:
    def every_other(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (kv <= q) & ((q - kv) % 2 == 0)

    n = 40
    layer = _layer(n, LazyMask.over(n, and_masks(causal_mask_function, every_other), torch.device("cpu")))
    assert layer.spans() is None
    for spec in (TileSpec(0, n, 0, n, 7, "max"), TileSpec(5, 33, 2, 30, 6, "mean"), TileSpec(0, n, 0, n, None, "max")):
        got = head_tile(layer, 1, spec)
        assert got.shape == spec.shape
        _same(got, _general(layer, 1, spec), atol=0.0)


def test_a_function_that_only_looks_like_a_sliding_window_is_checked_against_its_rows() -> None:
    """The ranges read from a function's name and parameters are checked on sampled rows of the real mask."""
    def impostor(sliding_window: int):  # type: ignore[no-untyped-def]
        def inner_mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            return kv > q - 2 * sliding_window  # not what the name promises

        inner_mask.__qualname__ = "sliding_window_overlay.<locals>.inner_mask"
        return inner_mask

    n = 64
    honest = LazyMask.over(n, and_masks(causal_mask_function, _window(5)), torch.device("cpu"))
    assert mask_spans(honest) is not None
    fake = LazyMask.over(n, and_masks(causal_mask_function, impostor(5)), torch.device("cpu"))
    assert mask_spans(fake) is None
    layer = _layer(n, fake)
    spec = TileSpec(0, n, 0, n, 9, "mean")
    _same(head_tile(layer, 0, spec), _general(layer, 0, spec), atol=0.0)


def _window(w: int):  # type: ignore[no-untyped-def]
    from transformers.masking_utils import sliding_window_overlay

    return sliding_window_overlay(w)


def test_long_rows_and_uneven_bins_pool_the_same_on_both_paths() -> None:
    """Bins of uneven widths on both axes, a window and the causal edge inside blocks, bins split across blocks."""
    n = 161
    layer = _layer(n, LazyMask.over(n, and_masks(_window(23), causal_mask_function), torch.device("cpu")), seed=3)
    assert layer.spans() is not None
    for spec in (TileSpec(0, n, 0, n, 48, "max"), TileSpec(0, n, 0, n, 48, "mean"), TileSpec(17, 150, 3, 130, 41, "max"),
                 TileSpec(17, 150, 3, 130, 41, "mean"), TileSpec(100, 140, 60, 141, None, "mean")):
        general = _general(layer, 3, spec)
        for budget in (50, 997, 1 << 20):
            _same(head_tile(layer, 3, spec, budget), general)
