"""No verb writes onto one of its inputs: `guarded` checks a verb's output paths against its
input paths (`io.outputs.check_outputs`) before the verb opens anything."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pivotrl.cli.console import fail
from pivotrl.io.outputs import OutputPathError, check_outputs, sidecars


def _paths(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def guarded(*, inputs: Iterable[str] = (), outputs: Iterable[str] = (), folders: Iterable[str] = (),
            beside: Callable[[Any], list[Path]] | None = sidecars):
    """Wrap a verb: its parameters named in `outputs`, and the files it writes beside each
    (`beside(out)`: by default `io.outputs.sidecars`; None: none), are checked against those
    named in `inputs` and in `folders` (inputs that are folders, such as a model: no output goes
    inside them) before it runs; an OutputPathError, there or from inside the verb, exits 2 with
    the message."""
    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def verb(*args, **kwargs):
            given = sig.bind_partial(*args, **kwargs).arguments
            ins = [p for k in inputs for p in _paths(given.get(k))]
            dirs = [p for k in folders for p in _paths(given.get(k))]
            outs = [q for k in outputs for p in _paths(given.get(k)) if p is not None
                    for q in [p, *(beside(p) if beside else [])]]
            try:
                check_outputs(ins, outs, input_folders=dirs)
                return fn(*args, **kwargs)
            except OutputPathError as exc:
                raise fail(str(exc), 2) from None
        return verb
    return wrap

