"""``attune agent serve``: run the agent sidecar (HTTP, :mod:`attune.agent.protocol`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

log = logging.getLogger(__name__)
app = typer.Typer(help="The tuning agent as an HTTP sidecar (for the Kubernetes operator).", no_args_is_help=True)


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8471,
    max_concurrency: Annotated[int, typer.Option(help="proposals served at once; more get 503")] = 4,
    lessons: Annotated[Path | None, typer.Option(help="lessons file (default: $ATTUNE_LESSONS or user data dir)")] = None,
    no_lessons: Annotated[bool, typer.Option("--no-lessons", help="do not read or write lessons")] = False,
) -> None:
    """Serve POST /v1/propose, POST /v1/observe and GET /healthz. LLM settings come from ATTUNE_LLM_*."""
    from aiohttp import web

    from attune.agent.lessons import LessonStore
    from attune.sidecar import make_app

    store = None if no_lessons else LessonStore(lessons)
    web.run_app(make_app(lessons=store, max_concurrency=max_concurrency), host=host, port=port, print=None)
