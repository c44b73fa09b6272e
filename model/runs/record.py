"""A run's record (what one forward captured and keeps) and the byte-capped LRU store that keeps runs server-side."""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch

from attnscope.model.attention.kept import LayerAttention
from attnscope.model.capture.names import parse
from attnscope.model.errors import BadInput, RunNotFound, TooLarge
from attnscope.model.results import RunSummary
from attnscope.model.runs.budget import mib_over
from attnscope.model.scores.analysis import SCORE_FIELDS, SCORE_NAMES, HeadScore, HeadSparsity


def tril_mask(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (n, n)


@dataclass
class PendingScores:
    """The work a stored run still owes: which fields of which layers, and who waits for them.

    ``done`` is set once the scores are in the run's summary, or the run was evicted first, or the
    sweep failed (``error``); ``model.runs.late`` does the work."""

    fields: dict[int, frozenset[str]]  # layer -> accumulator fields owed (``SCORE_FIELDS``)
    started: float  # perf_counter when the analyse began (for "scores_ready")
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    @property
    def names(self) -> list[str]:
        """The owed fields as HeadScore (and API) names, e.g. ["entropy", "max", "prev_token", "first_token",
        "induction"]."""
        owed = set().union(*self.fields.values()) if self.fields else set()
        return [SCORE_NAMES[f] for f in SCORE_FIELDS if f in owed]


@dataclass(frozen=True)
class FileScores:
    """A run file's head scores as its header holds them (read without its tensors)."""

    heads: list[HeadScore]
    scores_pending: tuple[str, ...]
    timing_ms: dict[str, float]


@dataclass
class RunRecord:
    """Everything one forward produced that the API may hand out later: O(n x d), never n x n.

    Shapes (n tokens, L layers, H heads, Hkv K/V heads, dh = d_head, d = d_model):

    * ``attention`` L ``LayerAttention`` (``model/attention/kept.py``): post-rotary Q (H, n, dh) and
      K (Hkv, n, dh) float32, each row's softmax normaliser (H, n), an ALiBi bias (H, n) where the
      family has one, and the layer's mask function. Any head's weights, any rows, any tile, are
      rebuilt from these exactly (``head_rows``); the n x n patterns are never kept;
    * ``resid``     L+1 tensors (n, d) float32: entry 0 is the embedding output
      (``blocks.0.hook_resid_pre``), entry i+1 is ``blocks.{i}.hook_resid_post``;
    * ``attn_out``  L tensors (n, d), ``blocks.{i}.hook_attn_out``;
    * ``mlp_out``   L tensors (n, d), ``blocks.{i}.hook_mlp_out``;
    * ``input_ids`` (n,) int64.

    Bytes kept (``nbytes``, what the store counts):
    4 n [L (H + Hkv) dh + L H (+ L H with ALiBi) + (3L + 1) d] + 8 n + the summary's estimate
    (``summary_bytes``) + what was attached later (``extra_bytes``).

    ``summary`` holds what the run reports besides tensors (tokens, predictions, head
    scores); ``sparsity`` the head sparsity, once asked for. Only the store changes a
    stored run (``RunStore.grow``, ``RunStore.settle``), so its byte count stays exact.
    ``pending`` is the work its head scores still owe (``model.runs.late``), or None: once
    they are computed, ``settle`` swaps in the completed summary, in the bytes already counted.
    """

    model: str
    causal: bool
    input_ids: torch.Tensor
    attention: list[LayerAttention]
    resid: list[torch.Tensor]
    attn_out: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    summary: RunSummary
    text: str
    # the summary's Python objects (tokens, predictions, head scores), estimated once when stored
    summary_bytes: int
    sparsity: list[HeadSparsity] | None = None
    # what was attached after the run was stored (sparsity), counted by RunStore.grow
    extra_bytes: int = 0
    pending: PendingScores | None = None
    # its file is on disk, whole and fsync'd (the run directory's writer sets it; a run read back from
    # one has it): what POST /api/runs' ``stored`` and GET /api/runs/{id}/stored report
    stored: bool = False
    # the fingerprint of the model that made it, once known ("": not computed; a run read from its file
    # has the file's): a tool that needs the model refuses when the model here has another
    model_fingerprint: str = ""

    @property
    def n(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_layers(self) -> int:
        return len(self.attention)

    @property
    def n_heads(self) -> int:
        return self.attention[0].n_heads

    def check_position(self, position: int, name: str = "position") -> None:
        """BadInput (position_out_of_range) unless this run has that position."""
        if not 0 <= position < self.n:
            raise BadInput(f"{name} {position} is out of range: this run has positions 0..{self.n - 1}",
                           code="position_out_of_range", params={"name": name, "position": position, "max": self.n - 1})

    def check_layer_head(self, layer: int, head: int | None) -> None:
        """BadInput (layer_out_of_range, head_out_of_range) unless this run has that layer (and head)."""
        if not 0 <= layer < self.n_layers:
            raise BadInput(f"layer {layer} is out of range: this model has layers 0..{self.n_layers - 1}",
                           code="layer_out_of_range", params={"layer": layer, "max": self.n_layers - 1})
        if head is not None and not 0 <= head < self.n_heads:
            raise BadInput(f"head {head} is out of range: this model has heads 0..{self.n_heads - 1}",
                           code="head_out_of_range", params={"head": head, "max": self.n_heads - 1})

    @property
    def nbytes(self) -> int:
        tensors = [self.input_ids, *self.resid, *self.attn_out, *self.mlp_out]
        return (sum(t.numel() * t.element_size() for t in tensors) + sum(a.nbytes for a in self.attention)
                + self.summary_bytes + self.extra_bytes)

    def head_rows(self, layer: int, head: int, q0: int, q1: int, k0: int = 0,
                  k1: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One head's exact weights for queries [q0, q1) x keys [k0, k1), and which cells are visible.

        Returns (weights (r, kw) float32, visible (r, kw) bool), rebuilt from the kept Q and K.
        """
        return self.attention[layer].rows(head, q0, q1, k0, k1)

    def packed(self, layer: int, head: int | None = None) -> torch.Tensor:
        """(H or 1, cells): the visible cells of one layer (or one head), row-major (small runs)."""
        pattern = self.pattern(layer) if head is None else self.head_pattern(layer, head)[None]
        return pack_pattern(pattern, self.causal)

    def head_pattern(self, layer: int, head: int) -> torch.Tensor:
        """(n, n) one head's whole pattern, zeros where masked (rebuilt: n x n, for small runs)."""
        weights, _visible = self.head_rows(layer, head, 0, self.n)
        return weights

    def pattern(self, layer: int) -> torch.Tensor:
        """(H, n, n) a layer's whole pattern with exact zeros where masked (rebuilt, for small runs)."""
        return self.attention[layer].dense()

    def __getitem__(self, name: str) -> torch.Tensor:
        """TransformerLens-style access: ``record[act_name("pattern", 0)]``."""
        kind, i = parse(name)
        if not 0 <= i < self.n_layers:
            raise KeyError(name)
        if kind == "pattern":
            return self.pattern(i)
        if kind == "rot_q":
            return self.attention[i].q
        if kind == "rot_k":
            return self.attention[i].k
        if kind == "resid_pre":
            return self.resid[i]
        if kind == "resid_post":
            return self.resid[i + 1]
        if kind == "attn_out":
            return self.attn_out[i]
        if kind == "mlp_out":
            return self.mlp_out[i]
        raise KeyError(name)


def pack_pattern(pattern: torch.Tensor, causal: bool) -> torch.Tensor:
    """(H, n, n) -> (H, cells): drop the masked future of a causal pattern."""
    if causal:
        return pattern[:, tril_mask(pattern.shape[-1], pattern.device)].contiguous()
    return pattern.reshape(pattern.shape[0], -1).contiguous()


class Backing(Protocol):
    """Where runs live beyond the memory (``model.runs.persist.RunFiles``: a run directory)."""

    def saved(self, run_id: str, record: RunRecord) -> None: ...

    def load(self, run_id: str) -> RunRecord | None: ...

    def claim(self, run_id: str) -> AbstractContextManager[bool]: ...

    def scores(self, run_id: str) -> FileScores | None: ...

    def flush(self) -> None: ...


class RunStore:
    """Runs by id, least recently used first out, with the total size capped in bytes.

    Thread-safe: handlers run in a thread pool. Evicted ids are remembered (boundedly)
    so that a client is told its run *expired* rather than that it never existed.
    """

    def __init__(self, max_bytes: int, remember_evicted: int = 10_000, backing: Backing | None = None) -> None:
        self.max_bytes = max_bytes
        self.backing = backing  # a run directory behind the memory (``model.runs.persist.RunFiles``), or None
        self.on_load: Callable[[str, RunRecord], None] | None = None  # told of each run read back
        self._runs: OrderedDict[str, RunRecord] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_evicted
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def add(self, record: RunRecord) -> str:
        """Keep a run under a new id (older ones go to make room; with a backing, written to its file too);
        a run larger than the whole cap is never kept."""
        run_id = secrets.token_urlsafe(12)
        self._keep(run_id, record)
        if self.backing is not None:
            self.backing.saved(run_id, record)
        return run_id

    def _keep(self, run_id: str, record: RunRecord) -> None:
        size = record.nbytes
        if size > self.max_bytes:
            keep, cap = mib_over(size, self.max_bytes)
            raise TooLarge(f"this run keeps {keep}; the run store holds at most {cap} "
                           "(ATTNSCOPE_RUN_STORE_BYTES)", code="run_over_cache", params={"keep": keep, "cap": cap})
        with self._lock:
            old = self._runs.pop(run_id, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._runs[run_id] = record
            self._bytes += size
            self._evict()

    def grow(self, run_id: str, record: RunRecord, nbytes: int, attach: Callable[[], bool]) -> None:
        """Attach something derived to a stored run, its ``nbytes`` counted against the cap.

        ``attach`` runs under the store's lock and says whether it attached anything (a
        concurrent request may have been first). A run evicted meanwhile is left alone.
        """
        with self._lock:
            if self._runs.get(run_id) is not record or not attach():
                return
            record.extra_bytes += nbytes
            self._bytes += nbytes
            self._runs.move_to_end(run_id)
            self._evict()

    def claim(self, run_id: str) -> AbstractContextManager[bool]:
        """Whether this process does the run's once-per-run work (its late head scores) now: always, without
        a backing; with a run directory shared by workers, only the one holding the run's claim."""
        return self.backing.claim(run_id) if self.backing is not None else nullcontext(True)

    def scores_elsewhere(self, run_id: str) -> FileScores | None:
        """The run's head scores as its file holds them (written by another worker), if complete there."""
        if self.backing is None:
            return None
        found = self.backing.scores(run_id)
        return found if found is not None and not found.scores_pending else None

    def flush(self) -> None:
        if self.backing is not None:
            self.backing.flush()

    def hold(self, run_id: str, record: RunRecord) -> None:
        """Keep this run under its id again if it was evicted: a run a user holds (``attnscope.Run``) is
        a value that stays; it comes back as the newest, older ones go to make room."""
        with self._lock:
            if self._runs.get(run_id) is record:
                self._runs.move_to_end(run_id)
                return
            self._evicted.pop(run_id, None)
        self._keep(run_id, record)

    def holds(self, run_id: str, record: RunRecord) -> bool:
        """Is this run (this very object) still stored? Touches nothing."""
        with self._lock:
            return self._runs.get(run_id) is record

    def settle(self, run_id: str, record: RunRecord, summary: RunSummary, write: bool = True) -> bool:
        """Swap a stored run's summary for its completed one (the late head scores: the same heads,
        counted when the run was added, so the byte count does not change, nor the run's place in the
        LRU). False, and nothing changed, if the run was evicted meanwhile."""
        with self._lock:
            if self._runs.get(run_id) is not record:
                return False
            record.summary = summary
        if write and self.backing is not None:  # the file gets the late scores too (unless they came from it)
            self.backing.saved(run_id, record)
        return True

    def _evict(self) -> None:
        """Oldest first until under the cap (the newest run fits alone: ``add`` checked). Caller holds the lock."""
        while self._bytes > self.max_bytes and len(self._runs) > 1:
            old_id, old = self._runs.popitem(last=False)
            self._bytes -= old.nbytes
            self._forget(old_id)

    def __iter__(self) -> Iterator[RunRecord]:
        """The stored runs, oldest first (a snapshot)."""
        with self._lock:
            return iter(list(self._runs.values()))

    def _forget(self, run_id: str) -> None:
        self._evicted[run_id] = None
        while len(self._evicted) > self._remember:
            self._evicted.popitem(last=False)

    def get(self, run_id: str) -> RunRecord:
        with self._lock:
            record = self._runs.get(run_id)
            if record is not None:
                self._runs.move_to_end(run_id)
                return record
            expired = run_id in self._evicted
        loaded = self.backing.load(run_id) if self.backing is not None else None  # outside the lock: disk
        if loaded is None:
            raise RunNotFound(run_id, expired=expired)
        with self._lock:
            record = self._runs.get(run_id)
            if record is not None:  # another request read it meanwhile
                return record
        self._keep(run_id, loaded)
        if self.on_load is not None:
            self.on_load(run_id, loaded)
        return loaded
