"""GGUF files (llama.cpp, Ollama, LM Studio) as model sources.

transformers reads a GGUF file through the ``gguf`` package and *de-quantizes* it: every weight
is the quantized value expanded to float (``Q4_1``: ``d * q + m`` per block of 32), so the model
attnscope inspects is the quantized model itself, computed in float32 — its attention is exact
for those weights, and differs from the original float checkpoint's by the quantization error.

De-quantizing and converting the tokenizer take a minute on 2 cores, so the result is written
once to the user's cache directory as a plain model folder (``config.json``, the tokenizer's
files, ``model.safetensors``) keyed by the file's size, modification time and a SHA-256 of its
first :data:`HEAD_BYTES` (the header: metadata and vocabulary); later starts load that folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from attnscope.model.errors import ModelLoadError

log = logging.getLogger(__name__)

MAGIC = b"GGUF"
HEAD_BYTES = 8 << 20  # what the cache key hashes: the header (metadata, vocabulary) and the first tensors
MARK = "attnscope-gguf.json"  # written last: a folder without it is incomplete and made again
_LOCK = threading.Lock()  # one conversion at a time in this process (another process: see _publish)


def cache_root() -> Path:
    """$ATTNSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/attnscope, else ~/.cache/attnscope."""
    explicit = os.environ.get("ATTNSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnscope"


def is_gguf(path: Path) -> bool:
    """A file whose first four bytes are GGUF's magic (Ollama's blobs have no extension)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def file_key(path: Path) -> str:
    """The cache key of a GGUF file: its size, mtime and the SHA-256 of its head, as 16 hex digits."""
    stat = path.stat()
    digest = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}:".encode())
    with path.open("rb") as f:
        digest.update(f.read(HEAD_BYTES))
    return digest.hexdigest()[:16]


def need_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError("reading a GGUF file needs the gguf package: pip install 'attnscope[gguf]'",
                             code="package_missing", params={"package": "attnscope[gguf]"})


def architecture(path: Path) -> str | None:
    """The file's ``general.architecture`` (``llama``, ``qwen2``, ...), read from its header."""
    need_gguf()
    from gguf import GGUFReader  # the optional extra

    try:
        field = GGUFReader(str(path)).get_field("general.architecture")
    except Exception:  # noqa: BLE001 -- a damaged file: transformers says more below
        return None
    if field is None:
        return None
    value = field.contents()
    return value if isinstance(value, str) else None


def file_type(path: Path) -> str | None:
    """The file's quantization (``general.file_type``: ``Q4_1``, ``Q8_0``, ``F16``, ...), or None."""
    try:
        import gguf as gguf_package

        field = gguf_package.GGUFReader(str(path)).get_field("general.file_type")
        if field is None:
            return None
        return str(gguf_package.LlamaFileType(int(field.contents())).name).removeprefix("MOSTLY_")
    except Exception:  # noqa: BLE001 -- a missing package, an unknown number: said as unknown
        return None


def describe(folder: Path) -> str | None:
    """What a model folder's weights are, where they came from a GGUF file: "GGUF Q4_1, de-quantized to
    float32" (None for any other folder)."""
    data = info(folder)
    if data is None:
        return None
    kind = data.get("file_type")
    if kind is None and isinstance(data.get("source"), str) and Path(str(data["source"])).is_file():
        kind = file_type(Path(str(data["source"])))  # a copy made before the type was recorded
    return f"GGUF {kind}, de-quantized to float32" if kind else "GGUF, de-quantized to float32"


def supported_architectures() -> list[str]:
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    names = getattr(gguf_utils, "GGUF_SUPPORTED_ARCHITECTURES", [])
    return sorted(str(n) for n in names)


def folder_for(path: Path, name: str) -> Path:
    """The cached model folder for a GGUF file, de-quantized and written there first if need be."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ModelLoadError(f"model {name!r}: GGUF file {path} does not exist", code="model_folder_missing",
                             params={"model": name, "folder": str(path)})
    folder = cache_root() / "gguf" / file_key(path)  # by content: Ollama's blob of the same file is the same copy
    if (folder / MARK).is_file():
        log.info("%s: de-quantized copy of %s found in %s", name, path.name, folder)
        return folder
    with _LOCK:
        if (folder / MARK).is_file():
            return folder
        _convert(path, folder, name)
    return folder


def _convert(path: Path, folder: Path, name: str) -> None:
    need_gguf()
    import torch
    from safetensors.torch import save_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    arch = architecture(path)
    supported = supported_architectures()
    if arch is not None and supported and arch not in supported:
        raise ModelLoadError(
            f"model {name!r}: GGUF architecture {arch!r} is not one transformers' GGUF loader reads "
            f"(it reads {', '.join(supported)})", code="architecture_unsupported",
            params={"model": name, "reason": f"GGUF architecture {arch}"})
    start = time.perf_counter()
    where, file = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=file)
    except Exception as exc:  # the loader raises ValueError, KeyError, ... on a file it cannot read
        raise ModelLoadError(f"model {name!r}: transformers could not read the GGUF file {path}: {exc}",
                             params={"model": name, "source": str(path), "reason": str(exc)}) from exc
    from attnscope.model.families.table import UnsupportedArchitecture, spec_for

    try:
        spec_for(config)
    except UnsupportedArchitecture as exc:
        raise ModelLoadError(f"model {name!r}: the GGUF file's architecture {arch!r} loads as "
                             f"{config.model_type!r}, which attnscope does not know: {exc}",
                             code="architecture_unsupported", params={"model": name, "reason": str(exc)}) from exc
    # float32 weights on disk: 4 bytes a parameter; refuse before writing what cannot fit
    root = cache_root() / "gguf"
    root.mkdir(parents=True, exist_ok=True)
    need = path.stat().st_size * 9  # Q4 is ~4.5 bits a weight: float32 is ~7x, with the tokenizer's files
    free = shutil.disk_usage(root).free
    if free < need:
        raise ModelLoadError(f"model {name!r}: de-quantizing {path.name} needs about {need >> 20} MiB in {root}, "
                             f"which has {free >> 20} MiB free (ATTNSCOPE_CACHE_DIR picks another place)",
                             params={"model": name, "source": str(path), "reason": "disk full"})
    log.info("%s: de-quantizing %s (%.0f MiB) to float32 in %s, once", name, path.name,
             path.stat().st_size / 2**20, folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=file, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=file)
    except Exception as exc:
        raise ModelLoadError(f"model {name!r}: transformers could not load the GGUF file {path}: {exc}",
                             params={"model": name, "source": str(path), "reason": str(exc)}) from exc
    tmp = folder.with_name(f"{folder.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the folder holds plain float weights
        config.dtype = torch.float32
        config.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))  # tied tensors once (the LM head of SmolLM2)
        (tmp / MARK).write_text(json.dumps({
            "source": str(path), "size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns,
            "key": file_key(path), "architecture": arch, "model_type": config.model_type,
            "file_type": file_type(path),
            "dequantized_to": "float32", "seconds": round(time.perf_counter() - start, 1),
        }, indent=1))
        _publish(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: de-quantized %s in %.1f s", name, path.name, time.perf_counter() - start)


def _publish(tmp: Path, folder: Path) -> None:
    """Move a finished copy into place; another process that finished first wins (its copy is the same)."""
    if folder.exists() and not (folder / MARK).is_file():
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete copy from an interrupted start
    try:
        os.rename(tmp, folder)
    except OSError:
        if not (folder / MARK).is_file():
            raise


def info(folder: Path) -> dict[str, object] | None:
    """What the cached folder records of its GGUF file (None for a folder that is not one)."""
    try:
        data = json.loads((folder / MARK).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
