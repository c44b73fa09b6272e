from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter

from attnscope.app.deps import EngineDep, TilesDep
from attnscope.app.memory import rss_bytes
from attnscope.app.schemas import AvailableModelOut, HealthOut, ModelOut, ModelsOut
from attnscope.model.load.models import LoadedModel
from attnscope.model.runs.persist import RunFiles
from attnscope.model.scores import probes
from attnscope.model.services.engine import Engine

router = APIRouter(tags=["models"])


def model_out(engine: Engine, name: str, lm: LoadedModel) -> ModelOut:
    return ModelOut(**asdict(lm.info), default=name == engine.default, family=lm.info.architecture,
                    max_tokens=engine.token_limit(lm), induction_scores=probes.induction(lm))


@router.get("/models", response_model=ModelsOut, summary="The models this server offers")
def list_models(engine: EngineDep) -> ModelsOut:
    out = [model_out(engine, name, lm) for name, lm in engine.models.items()]
    return ModelsOut(models=out, available=[AvailableModelOut(name=name, about=about)
                                            for name, (about, _loader) in engine.loadable.items()])


@router.post("/models/{name}/load", response_model=ModelOut,
             summary="Load an offered model now (the explorer's picker does, before the first analyse)",
             description="Answers once the model is loaded (seconds; a GGUF file's first de-quantization, about a "
                         "minute); a loaded model answers at once. 404 `unknown_model` for a name neither loaded "
                         "nor offered.")
def load_offered(name: str, engine: EngineDep) -> ModelOut:
    return model_out(engine, name, engine.model(name))


@router.get("/health", response_model=HealthOut, summary="Liveness, the run store's size and the process's memory")
def health(engine: EngineDep, tiles: TilesDep) -> HealthOut:
    return HealthOut(status="ok", models=list(engine.models), runs=len(engine.store),
                     run_cache_bytes=engine.store.nbytes, run_cache_max_bytes=engine.store.max_bytes,
                     tile_cache_bytes=tiles.cache.nbytes, tile_cache_max_bytes=tiles.cache.max_bytes,
                     rss_bytes=rss_bytes(), worker=os.getpid(), **run_dir_of(engine))


def run_dir_of(engine: Engine) -> dict[str, Any]:
    backing = engine.store.backing
    if not isinstance(backing, RunFiles):
        return {}
    return {"run_dir": str(backing.folder.path), "run_dir_bytes": backing.folder.nbytes}
