"""HTTP routes, one module per concern (none imports another), assembled here into one tree:
``/api/…`` (models, runs, generate, learn, interventions) and the pages. Each handler is a thin map
from a ``model.services`` result to its response schema."""

from fastapi import APIRouter

from attnscope.app.routes import generate, interventions, learn, models, pages, runs, surveys

api = APIRouter(prefix="/api")
for module in (models, runs, generate, learn, interventions, surveys):
    api.include_router(module.router)

router = APIRouter()
router.include_router(api)
router.include_router(pages.router)
