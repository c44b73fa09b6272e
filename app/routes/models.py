from __future__ import annotations

import os
from dataclasses import asdict

from fastapi import APIRouter

from attnscope.app.deps import EngineDep, TilesDep
from attnscope.app.memory import rss_bytes
from attnscope.app.schemas import HealthOut, ModelOut, ModelsOut
from attnscope.model.services import models
from attnscope.model.services.models import ModelView

router = APIRouter(tags=["models"])


def model_out(view: ModelView) -> ModelOut:
    return ModelOut(**asdict(view.info), default=view.default, family=view.info.architecture,
                    max_tokens=view.max_tokens, induction_scores=view.induction_scores)


@router.get("/models", response_model=ModelsOut, summary="The models this server offers")
def list_models(engine: EngineDep) -> ModelsOut:
    return ModelsOut(models=[model_out(v) for v in models.loaded(engine)],
                     available=list(models.offered(engine)))


@router.post("/models/{name}/load", response_model=ModelOut,
             summary="Load an offered model now (the explorer's picker does, before the first analyse)",
             description="Answers once the model is loaded (seconds; a GGUF file's first de-quantization, about a "
                         "minute); a loaded model answers at once. 404 `unknown_model` for a name neither loaded "
                         "nor offered.")
def load_offered(name: str, engine: EngineDep) -> ModelOut:
    return model_out(models.view(engine, name=name))


@router.get("/health", response_model=HealthOut, summary="Liveness, the run store's size and the process's memory")
def health(engine: EngineDep, tiles: TilesDep) -> HealthOut:
    folder = models.run_dir(engine)
    return HealthOut(status="ok", models=list(engine.models), runs=len(engine.store),
                     run_cache_bytes=engine.store.nbytes, run_cache_max_bytes=engine.store.max_bytes,
                     tile_cache_bytes=tiles.cache.nbytes, tile_cache_max_bytes=tiles.cache.max_bytes,
                     rss_bytes=rss_bytes(), worker=os.getpid(), run_dir=folder.path if folder else None,
                     run_dir_bytes=folder.nbytes if folder else 0)
