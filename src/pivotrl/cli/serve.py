"""`pivotrl serve`: an OpenAI-compatible endpoint around a local HF model (`pivotrl.sampling.serve`)."""

from __future__ import annotations

from typing import Optional

import typer

from pivotrl.cli.console import console, fail


def serve(
    model: str = typer.Option(..., help="HF model dir (or name) to serve."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
    port: int = typer.Option(8000, help="TCP port."),
    batch_size: int = typer.Option(64, help="Sequences per generate call."),
    served_model_name: Optional[str] = typer.Option(None, help="Name in /v1/models (default: the --model value)."),
    max_tokens_limit: Optional[int] = typer.Option(None, help="Largest max_tokens (default: the context)."),
    max_request_tokens: int = typer.Option(65536, help="Largest n x (prompt + max_tokens) over the "
                                           "prompts of one request; bounds its body's size too."),
) -> None:
    """An OpenAI-compatible endpoint around a local HF model (/health, /v1/models, /v1/completions,
    /v1/chat/completions, streaming too), e.g. for `pivotrl profile --backend openai` or a judge on a CPU."""
    from pivotrl.io.inputs import InputError, check_model
    from pivotrl.sampling.serve import serve as run_server

    try:
        check_model(model)
    except InputError as exc:
        raise fail(str(exc), 2) from None
    console.print(f"serving {model} at http://{host}:{port}/v1")
    run_server(model, host=host, port=port, batch_size=batch_size, served_name=served_model_name,
               max_tokens_limit=max_tokens_limit, max_request_tokens=max_request_tokens)
