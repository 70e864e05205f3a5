"""Score a file of verify cases (the library behind `pivotrl verify`).

A case is a Turn plus `"candidate"` (an assistant message) or `"completion"` (raw model text,
parsed in the model's own format when a parser is given (`pivotrl verify --model DIR`:
`formats.parser_for` of DIR's tokenizer, exactly as profiling and training parse it; without
--model the Hermes/JSON `parse_completion`); when both are
present the candidate is scored. The output has one JSON object per input line, in input order:
`{"id", "reward", "valid", "reason"}`. A bad line (not JSON, not a Turn, no candidate, …) still
gets its line, with reward 0, valid false and a reason naming the line and field, so that output
line i always answers input line i.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from pivotrl.formats.actions import parse_completion
from pivotrl.io.outputs import check_outputs
from pivotrl.io.records import (Message, Reject, Turn, _first_error, is_blank, iter_lines,
                             parse_json_line, parse_object)
from pivotrl.scoring import Parser, score_actions
from pivotrl.io.compact_rows import RowDecoder
from pivotrl.io.yaml_config import read_mapping
from pivotrl.verifiers import get_verifier

BATCH = 256  # cases per score_batch call (the judge verifier sends a batch concurrently)


def load_verifier_options(path: str | Path | None, verifier_name: str) -> dict[str, Any]:
    """Verifier options from YAML: a flat mapping of options, or one section per verifier name
    (`toolcall: {...}`) from which the named verifier's section is taken."""
    if path is None:
        return {}
    data = read_mapping(path)
    if isinstance(data.get(verifier_name), dict):
        return dict(data[verifier_name])
    return data


@dataclass
class VerifySummary:
    lines: int = 0
    bad_lines: int = 0
    valid: int = 0
    reward_sum: float = 0.0
    reasons: Counter = field(default_factory=Counter)

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.lines if self.lines else 0.0


def _case(lineno: int, line: str, parse: Parser = parse_completion, rows: RowDecoder | None = None
          ) -> tuple[str | None, Turn | None, Message | None, str]:
    """(id, turn, action, problem) for one input line; problem != "" means a bad line.
    rows: cases made from a compact turns file continue the previous line's row (the one
    expansion, `records.parse_object`)."""
    if is_blank(line):
        return None, None, None, f"line {lineno}: blank line"
    obj, problem = parse_json_line(line)
    if problem:
        return None, None, None, f"line {lineno}: {problem}"
    if not isinstance(obj, dict):
        return None, None, None, f"line {lineno}: expected a JSON object, got {type(obj).__name__}"
    case_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    turn = parse_object("", lineno, obj, line, Turn, None, rows)
    if isinstance(turn, Reject):
        return case_id, None, None, f"line {lineno}: field {turn.field}: {turn.reason}"
    if "candidate" in obj:
        raw = obj["candidate"]
        if isinstance(raw, dict):
            raw = {"role": "assistant", **raw}
        try:
            message = Message.model_validate(raw)
        except ValidationError as exc:
            loc, msg = _first_error(exc)
            return case_id, turn, None, f"line {lineno}: field candidate.{loc}: {msg}"
        if message.role != "assistant":
            return case_id, turn, None, f"line {lineno}: field candidate.role: must be 'assistant'"
        return case_id, turn, message, ""
    if "completion" in obj:
        if not isinstance(obj["completion"], str):
            return case_id, turn, None, f"line {lineno}: field completion: must be a string"
        if getattr(parse, "typed_by_tools", False):
            parsed = parse(obj["completion"], turn.tools)
        else:
            parsed = parse(obj["completion"])
        return case_id, turn, parsed.message, parsed.reason  # an invalid parse is scored 0
    return case_id, turn, None, f"line {lineno}: neither 'candidate' nor 'completion'"


def verify_file(cases_path: str | Path, verifier_name: str, config: dict[str, Any] | None = None,
                out_path: str | Path | TextIO | None = None, parse: Parser = parse_completion
                ) -> VerifySummary:
    """Score every line of `cases_path`; write the results to `out_path`, a path or an open text
    stream (the CLI's stdout); None: the summary only.
    parse: how "completion" texts are read (the model's `formats.parser_for`)."""
    import io

    to_file = isinstance(out_path, (str, Path))
    if to_file:
        check_outputs([cases_path], [out_path])
    verifier = get_verifier(verifier_name, **(config or {}))
    summary = VerifySummary()
    out = (open(out_path, "w", encoding="utf-8") if to_file
           else out_path if out_path is not None else io.StringIO())
    pending: list[tuple[str | None, Turn | None, Message | None, str]] = []
    rows = RowDecoder()

    def flush() -> None:
        scores = score_actions(verifier, [c[1] for c in pending], [c[2] for c in pending],
                               [c[3] for c in pending])
        for (case_id, _, _, problem), s in zip(pending, scores):
            reward, valid, reason = s.reward, s.valid, s.reason
            summary.bad_lines += (not valid) and problem.startswith("line ")
            summary.lines += 1
            summary.valid += valid
            summary.reward_sum += reward
            if reason:
                summary.reasons[_reason_kind(reason)] += 1
            out.write(json.dumps({"id": case_id, "reward": reward, "valid": valid,
                                  "reason": reason}, ensure_ascii=False) + "\n")
        out.flush()
        pending.clear()

    try:
        for lineno, line, problem in iter_lines(cases_path):
            pending.append((None, None, None, f"line {lineno}: {problem}") if problem
                           else _case(lineno, line, parse, rows))
            if problem or not is_blank(line):
                rows.line_done(lineno)
            if len(pending) >= BATCH:
                flush()
        flush()
    finally:
        if to_file:
            out.close()
    return summary


def _reason_kind(reason: str) -> str:
    """Group reasons for the summary table: drop line numbers and quoted values."""
    if reason.startswith("line ") and ": " in reason:
        reason = reason.split(": ", 1)[1]
    return reason.split(":", 1)[0][:60]
