"""Load a Hugging Face model for inspection.

The attention implementation comes from the family's entry in ``model/families/table.py``:
``"attnscope"`` (the one capture point, ``model/capture/interface.py``) for every family whose
attention goes through transformers' ``AttentionInterface``, ``"eager"`` for the few
that do not (their eager path returns the weights). Always ``.eval()``, never
``trust_remote_code``. Device and dtype come from :class:`Placement`. A *source* (``bundled:NAME``,
``package:MODULE``, a GGUF file, ``ollama:MODEL[:TAG]``, ``smollm2-135m``, a folder or a hub id) is
resolved to a folder by ``model/load/sources.py``.

Requests never name a source: they pick one of the configured *names*.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from attnscope.model import compat
from attnscope.model.attention import interface
from attnscope.model.errors import AttentionUnavailable, ModelLoadError
from attnscope.model.families.config import Dimensions, dimensions
from attnscope.model.families.table import (
    ArchSpec,
    PositionEncoding,
    UnsupportedArchitecture,
    blocks,
    find,
    logit_transform,
    max_positions,
    spec_for,
)
from attnscope.model.load import gguf, sources

log = logging.getLogger(__name__)

BUNDLED_DIR = sources.BUNDLED_DIR

DeviceName = str  # "auto" | "cpu" | "cuda" | "cuda:N" | "mps"
DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Placement:
    """Where and in what precision a model runs (ATTNSCOPE_DEVICE, _DTYPE, _DEVICE_MAP, _MAX_MEMORY)."""

    device: DeviceName = "auto"  # auto: CUDA if present, else MPS, else CPU
    dtype: DtypeName = "auto"  # auto: the checkpoint's dtype on a GPU, float32 on CPU
    device_map: Literal["auto"] | None = None  # "auto": accelerate spreads the layers over the GPUs
    max_memory: dict[str, str] | None = None  # with device_map: e.g. {"0": "70GiB", "cpu": "200GiB"}


def resolve_device(name: DeviceName) -> torch.device:
    """``auto`` -> the best accelerator present; anything else must exist on this machine."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ModelLoadError(f"ATTNSCOPE_DEVICE={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps",
                             code="device_invalid", params={"device": name}) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"ATTNSCOPE_DEVICE={name!r} but CUDA is not available on this machine",
                                 code="device_unavailable", params={"device": name})
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(f"ATTNSCOPE_DEVICE={name!r} but this machine has {torch.cuda.device_count()} GPU(s)",
                                 code="device_unavailable", params={"device": name})
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"ATTNSCOPE_DEVICE={name!r} but MPS is not available on this machine",
                             code="device_unavailable", params={"device": name})
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"ATTNSCOPE_DEVICE={name!r} is not supported; use auto, cpu, cuda, cuda:N or mps",
                             code="device_invalid", params={"device": name})
    return device


def resolve_dtype(name: DtypeName, device: torch.device, checkpoint: torch.dtype | None) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu" or checkpoint is None or not checkpoint.is_floating_point:
        return torch.float32
    return checkpoint


@dataclass(frozen=True)
class ModelInfo(Dimensions):
    """What a client needs to know to read the model's activations: its sizes (``Dimensions``) and
    the following."""

    name: str
    architecture: str
    max_positions: int | None  # None: the position scheme has no limit (ALiBi)
    position_encoding: PositionEncoding
    causal: bool
    has_lm_head: bool
    n_params: int
    device: str  # the device of the input embedding ("cuda:0", "cpu", ...)
    dtype: str  # the parameters' dtype ("float32", "bfloat16", ...)
    has_chat_template: bool = False
    # where the weights came from, when that changes what they are: "GGUF Q4_1, de-quantized to float32"
    weights: str | None = None


@dataclass
class ProbeResults:
    """What ``model.scores.probes`` measured on a model: once per model, on first use.

    A copy of a LoadedModel (``dataclasses.replace``: a renamed one) shares this object, so
    a probe runs once however many engines or names serve the model. Each result names the
    module it was measured on: a copy given another ``model`` measures again.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    attention_checked: nn.Module | None = None  # the model whose attention returned weights
    path_said: nn.Module | None = None  # the model whose attention path (fused or blocks) was logged
    induction: tuple[nn.Module, list[list[float]]] | None = None  # (model, [layer][head] scores)


@dataclass
class LoadedModel:
    """A model ready for inspection, with the lock that serialises its forwards."""

    info: ModelInfo
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: ArchSpec
    source: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    probes: ProbeResults = field(default_factory=ProbeResults)

    @property
    def blocks(self) -> nn.ModuleList:
        return blocks(self.model, self.spec)

    @property
    def final_norm(self) -> nn.Module | None:
        return find(self.model, self.spec.final_norm) if self.spec.final_norm else None

    @property
    def after_final_norm(self) -> nn.Module | None:
        return find(self.model, self.spec.after_final_norm) if self.spec.after_final_norm else None

    @property
    def unembed(self) -> nn.Module | None:
        return output_embeddings(self.model) if self.info.has_lm_head else None

    @property
    def input_device(self) -> torch.device:
        """Where input ids go: the input embedding's device (the first layer's, with a device map)."""
        return input_embeddings(self.model).device

    @property
    def dtype(self) -> torch.dtype:
        return input_embeddings(self.model).dtype

    def lm_head(self) -> LMHead | None:
        """What reads a residual state as next-token logits, or None for an encoder without an LM head."""
        unembed = self.unembed
        if unembed is None:
            return None
        return LMHead(final_norm=self.final_norm, after_final_norm=self.after_final_norm, unembed=unembed,
                      spec=self.spec, config=self.model.config)


@dataclass(frozen=True)
class LMHead:
    """The final norm, the LM head and the family's final logit transform (Gemma-2's soft-cap,
    Cohere's logit_scale, Granite's logits_scaling): read at the last layer, it gives the
    model's own logits exactly. ``unembed`` is known to exist."""

    final_norm: nn.Module | None
    after_final_norm: nn.Module | None  # OPT's project_out
    unembed: nn.Module
    spec: ArchSpec
    config: PretrainedConfig

    def logits(self, resid: torch.Tensor, transform: bool = True) -> torch.Tensor:
        """(..., d) residual states -> (..., V) float32 logits.

        The residual enters in the model's own dtype and on the LM head's device, so the
        last layer's lens equals the model's logits; the transform runs in float32.
        ``transform=False`` stops before the family's final logit transform (the linear
        logit that direct logit attribution splits).
        """
        weight = self.unembed.get_parameter("weight")
        h = resid.to(device=weight.device, dtype=weight.dtype)
        with torch.inference_mode():
            if self.final_norm is not None:
                h = self.final_norm(h)
            if self.after_final_norm is not None:
                h = self.after_final_norm(h)
            out: torch.Tensor = self.unembed(h)
        return logit_transform(self.spec, self.config, out.float()) if transform else out.float()


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


def resolve_source(source: str, name: str | None = None) -> str:
    """A source string → what ``from_pretrained`` takes (a folder or a hub id): ``model/load/sources.py``."""
    return sources.resolve(source, name or source)


def _is_hub_id(where: str) -> bool:
    return not Path(where).exists() and not where.startswith((".", "/", "~")) and where.count("/") <= 1


def load_model(name: str, source: str, placement: Placement | None = None) -> LoadedModel:
    """Load one configured model; raises ModelLoadError with a readable one-line message."""
    placement = placement or Placement()
    where = resolve_source(source, name)
    if (where.startswith((".", "/")) or Path(where).exists()) and not Path(where).is_dir():
        raise ModelLoadError(f"model {name!r}: folder {where} does not exist", code="model_folder_missing",
                             params={"model": name, "folder": where})
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=False)
    except OSError as exc:
        if _is_hub_id(where):
            raise ModelLoadError(f"model {name!r}: {where!r} is not a local folder and the Hugging Face hub "
                                 f"could not be reached (offline?): {str(exc).splitlines()[0]}",
                                 code="hub_unreachable", params={"model": name, "source": where}) from exc
        raise ModelLoadError(f"model {name!r} could not be loaded from {where}: {exc}",
                             params={"model": name, "source": where, "reason": str(exc)}) from exc
    except Exception as exc:  # from_pretrained raises many types; report them all the same way
        raise ModelLoadError(f"model {name!r} could not be loaded from {where}: {exc}",
                             params={"model": name, "source": where, "reason": str(exc)}) from exc
    try:
        spec = spec_for(config)
    except UnsupportedArchitecture as exc:
        raise ModelLoadError(f"model {name!r}: {exc}", code="architecture_unsupported",
                             params={"model": name, "reason": str(exc)}) from exc
    device = resolve_device(placement.device)
    dtype = resolve_dtype(placement.dtype, device, getattr(config, "dtype", None))
    interface.register()
    # Any: transformers >= 5.25 types each keyword of from_pretrained, and these vary by key
    kwargs: dict[str, Any] = {"attn_implementation": spec.attn_implementation, "dtype": dtype}
    if placement.device_map is not None:
        if importlib.util.find_spec("accelerate") is None:
            raise ModelLoadError("ATTNSCOPE_DEVICE_MAP=auto needs accelerate: pip install 'attnscope[multi-gpu]' "
                                 "(or pip install accelerate)", code="package_missing",
                                 params={"package": "accelerate"})
        kwargs["device_map"] = placement.device_map
        if placement.max_memory:
            kwargs["max_memory"] = {int(k) if k.isdigit() else k: v for k, v in placement.max_memory.items()}
    log.info("loading %s from %s (%s, %s%s)", name, where, spec.attn_implementation, dtype,
             ", device_map=auto" if placement.device_map else f", {device}")
    try:
        cls = AutoModelForCausalLM if spec.causal else AutoModel
        model = cls.from_pretrained(where, trust_remote_code=False, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except Exception as exc:  # from_pretrained raises many types; report them all the same way
        raise ModelLoadError(f"model {name!r} could not be loaded from {where}: {exc}",
                             params={"model": name, "source": where, "reason": str(exc)}) from exc
    if placement.device_map is None:
        nn.Module.to(model, device)  # (transformers wraps PreTrainedModel.to with a mistyped decorator)
    lm = wrap_model(name, model, tokenizer, source)
    weights = gguf.describe(Path(where)) if Path(where).is_dir() else None
    return lm if weights is None else replace(lm, info=replace(lm.info, weights=weights))


def wrap_model(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str) -> LoadedModel:
    """A model already in memory (loaded, or built from a config in a test), ready for inspection.

    Switches its attention to the family's capture implementation for good (the server owns its
    models); ``borrowed`` does the same for the length of a ``with`` only (the Python door).
    """
    lm = inspect_model(name, model, tokenizer, source)
    switch_attention(lm)
    model.eval()
    model.requires_grad_(False)
    log.info("loaded %s: %s, %d layers x %d heads, d_model %d, %d parameters, %s on %s",
             name, lm.info.architecture, lm.info.n_layers, lm.info.n_heads, lm.info.d_model, lm.info.n_params,
             lm.info.dtype, lm.info.device)
    return lm


def inspect_model(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str) -> LoadedModel:
    """What attnscope knows of a model (its family's spec, its sizes), changing nothing on it."""
    try:
        spec = spec_for(model.config)
    except UnsupportedArchitecture as exc:
        raise ModelLoadError(f"model {name!r}: {exc}", code="architecture_unsupported",
                             params={"model": name, "reason": str(exc)}) from exc
    interface.register()
    return LoadedModel(info=describe(name, model, spec, tokenizer), model=model, tokenizer=tokenizer, spec=spec,
                       source=source)


def switch_attention(lm: LoadedModel) -> Callable[[], None]:
    """Route the model's attention through the family's capture implementation; returns what removes the
    hooks that tell it whether a forward asked for ``output_attentions`` (``interface.watch_output_flag``)."""
    model = lm.model
    unwatch = interface.watch_output_flag(model)
    want = lm.spec.attn_implementation
    if compat.attention_implementation(model) != want:
        model.set_attn_implementation(want)
    now = compat.attention_implementation(model)
    if now is not None and now != want:  # None: the config does not say; the set above is trusted
        unwatch()
        raise AttentionUnavailable(
            f"model {lm.info.name!r} uses {now!r} attention, which does not "
            f"return attention weights; attnscope needs {want!r}"
        )
    return unwatch


@contextmanager
def borrowed(lm: LoadedModel) -> Iterator[None]:
    """The model switched for inspection (the capture attention, eval mode, no autograd) for the
    ``with`` only; afterwards, even when the body raised, its attention implementation and every
    module's training flag are as they were. Parameters and ``requires_grad`` are never touched:
    everything inside runs under ``torch.inference_mode``."""
    model = lm.model
    with lock_of(model):  # one borrower at a time, whichever Scope or widget holds this model object
        implementation = compat.attention_implementation(model)
        training = [(module, module.training) for module in model.modules()]
        unwatch = interface.watch_output_flag(model)  # the hooks are the borrow's: removed with it
        try:
            switch_attention(lm)
            model.eval()
            with torch.inference_mode():
                yield
        finally:
            if implementation is not None and compat.attention_implementation(model) != implementation:
                model.set_attn_implementation(implementation)
            for module, flag in training:
                module.training = flag
            unwatch()


_BORROW_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_BORROW_LOCKS_LOCK = threading.Lock()


def lock_of(model: nn.Module) -> threading.RLock:
    """The one lock of a model object: two Scopes (or two widgets) over the same model must not switch
    its attention implementation at once (the second would take the first's switch for the model's own)."""
    with _BORROW_LOCKS_LOCK:
        lock = _BORROW_LOCKS.get(model)
        if lock is None:
            lock = _BORROW_LOCKS[model] = threading.RLock()
        return lock


def describe(name: str, model: PreTrainedModel, spec: ArchSpec,
             tokenizer: PreTrainedTokenizerBase | None = None) -> ModelInfo:
    cfg = model.config
    dims = dimensions(cfg)  # (n_layers, n_heads, n_kv_heads, d_model, d_head, d_mlp, vocab_size)
    embed = input_embeddings(model)
    return ModelInfo(
        name=name,
        architecture=cfg.model_type,
        **vars(dims),
        max_positions=max_positions(cfg, spec),
        position_encoding=spec.position_encoding,
        causal=spec.causal,
        has_lm_head=spec.causal and output_embeddings(model) is not None,
        n_params=sum(p.numel() for p in model.parameters()),
        device=str(embed.device),
        dtype=str(embed.dtype).removeprefix("torch."),
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
    )
