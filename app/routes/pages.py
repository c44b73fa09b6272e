"""The browser app's page, API docs page, and plotly.js from the installed package."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.templating import Jinja2Templates

from attnscope.app.embed import plotly_js_path

ROOT = Path(__file__).resolve().parents[2]
templates = Jinja2Templates(directory=str(ROOT / "templates"))
router = APIRouter(include_in_schema=False)


def swagger_dir() -> Path:
    """Swagger UI 5 (it reads the OpenAPI 3.1 that FastAPI writes; 4.x cannot), vendored in
    the swagger-ui-bundle-v2 wheel. The folder is looked up rather than read from the
    package's ``swagger_ui_path``: the older swagger-ui-bundle shares the module name."""
    import swagger_ui_bundle

    root = Path(swagger_ui_bundle.__file__).resolve().parent / "vendor"

    def version(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in p.name.removeprefix("swagger-ui-").split(".") if x.isdigit())

    found = sorted((p for p in root.glob("swagger-ui-*") if version(p) >= (5,)), key=version)
    if not found:
        raise RuntimeError("Swagger UI 5 is not installed (pip install swagger-ui-bundle-v2)")
    return found[-1]


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "index.html", {})


@router.get("/learn", response_class=HTMLResponse)
def learn(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "learn.html", {})


@router.get("/docs", response_class=HTMLResponse)
def docs(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "docs.html", {})


@router.get("/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(plotly_js_path(), media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/vendor/swagger/{name}")
def swagger_asset(name: str) -> FileResponse:
    allowed = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}
    if name not in allowed:
        raise HTTPException(404, f"no such asset {name!r}")
    return FileResponse(swagger_dir() / name, media_type=allowed[name])
