"""Corpus surveys: start one on an uploaded corpus file, follow it, read its result, download its file, or
open a survey file made elsewhere (``attnscope survey``). A survey runs in a thread of the server's
``SurveyJobs`` (``model.services.survey``); these handlers only start, read and stop them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from attnscope.app.deps import EngineDep, GateDep, SurveysDep
from attnscope.app.errors import ERRORS, ErrorOut
from attnscope.app.upload import spooled
from attnscope.model.services import files
from attnscope.model.services.survey import SurveyStatus

router = APIRouter(tags=["surveys"])
BODY = {"requestBody": {"required": True, "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}}


@router.post("/surveys", status_code=202, response_model=SurveyStatus, responses={**ERRORS, 413: {"model": ErrorOut}},
             openapi_extra=BODY, summary="Survey a corpus: every head's statistics and top examples over its documents",
             description="The body is the corpus file (at most ATTNSCOPE_MAX_CORPUS_BYTES): plain UTF-8 text with "
                         "documents between blank lines, or JSON Lines with a string field `text` (`name` ending "
                         "in .jsonl, or a first line that opens a JSON object). 202 at once with the survey's `id`; "
                         "GET /api/surveys/{id} follows it (progress, then the result). A binary file, invalid "
                         "UTF-8, an overlong line or a JSON line without `text` fails the survey with a message "
                         "naming the line.")
async def start_survey(request: Request, engine: EngineDep, surveys: SurveysDep, gate: GateDep,
                       name: Annotated[str | None, Query(max_length=200)] = None,
                       model: Annotated[str | None, Query(max_length=200)] = None,
                       max_tokens: Annotated[int, Query(ge=2, le=1 << 20)] = 512,
                       top_k: Annotated[int, Query(ge=1, le=50)] = 5) -> SurveyStatus:
    async with spooled(request, files.spool_folder(engine)) as path:
        return await run_in_threadpool(surveys.start, engine, path, name=name, model=model, max_tokens=max_tokens,
                                       top_k=top_k, on_compute=gate.on_compute)  # its forwards on the compute thread


@router.post("/surveys/open", status_code=201, response_model=SurveyStatus,
             responses={**ERRORS, 413: {"model": ErrorOut}}, openapi_extra=BODY,
             summary="Open a survey file (attnscope survey, a download) as a finished survey here")
async def open_survey(request: Request, engine: EngineDep, surveys: SurveysDep) -> SurveyStatus:
    async with spooled(request, files.spool_folder(engine)) as path:
        return await run_in_threadpool(surveys.open, path)


@router.get("/surveys/{survey_id}", response_model=SurveyStatus, responses=ERRORS,
            summary="A survey's progress, and its result once done")
def get_survey(survey_id: str, surveys: SurveysDep) -> SurveyStatus:
    return surveys.status(survey_id)


@router.post("/surveys/{survey_id}/stop", response_model=SurveyStatus, responses=ERRORS,
             summary="Stop a running survey (after the document it is reading)")
def stop_survey(survey_id: str, surveys: SurveysDep) -> SurveyStatus:
    return surveys.stop(survey_id)


@router.get("/surveys/{survey_id}/file", response_class=FileResponse, responses=ERRORS,
            summary="A finished survey's file (safetensors + JSON header): attnscope.load and the explorer open it")
def survey_file(survey_id: str, surveys: SurveysDep) -> FileResponse:
    return FileResponse(surveys.file(survey_id), media_type="application/octet-stream",
                        filename=f"{survey_id}.survey.safetensors")
