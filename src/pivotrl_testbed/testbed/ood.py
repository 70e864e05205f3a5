"""Out-of-domain (non-agentic) task families with exact checkers: the skills RL must not erode.

Families: `add` (a + b), `sub` (a - b, a ≥ b), `next` (n + 1), `reverse` (reverse a word),
`upper` (a word in capitals), `recall` (key–value recall from a short list, one pair per line).
Each task is one user message and an expected answer text. Train and eval are split by the
*problem* (a hash of its canonical key), so no problem appears on both sides whatever the seed.
The agentic-format families (`agentic_ood.py`) use the same record with a system prompt and a
tool list.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pivotrl.io.records import Message, write_atomic
from pivotrl_testbed.testbed.common import EVAL_PERCENT, stable_int

FAMILIES = ["add", "sub", "next", "reverse", "upper", "recall"]
LETTERS = "abcdefghijklmnoprstu"
MAX_NUMBER = 50  # small operands: the tiny base must reach ≥ 80% within the build
MAX_NEXT = 2000  # `next`: arithmetic a 2-layer base learns in the build (a carry only after a 9)

_PROMPTS = {
    "add": ["What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?"],
    "sub": ["What is {a} - {b}?", "Compute {a} - {b}.", "{a} - {b} = ?"],
    "next": ["What number comes after {n}?", "Next number after {n}?", "Count one up from {n}."],
    "reverse": ["Reverse the word {w}.", "Write {w} backwards.", "Spell {w} in reverse."],
    "upper": ["Write {w} in capital letters.", "Uppercase the word {w}.", "Say {w} in caps."],
    # One pair per line, asked as "key=?" on the last line: every key is spelled with the same
    # tokens (measured, recall alone, 600 steps: 0.57 eval accuracy; one-letter keys: 0.15).
    "recall": ["{kv}\n{k}=?", "Remember:\n{kv}\n{k}=?", "Given\n{kv}\nWhat is\n{k}=?"],
}


@dataclass(frozen=True)
class OODTask:
    id: str
    family: str
    prompt: str
    answer: str
    split: str
    key: str = ""  # the canonical problem ("add 3 4"): the unit of the train/eval split
    # Agentic-format tasks only (agentic_ood.py); a plain task leaves them empty, and its record
    # is written without them, as before they existed.
    system: str = ""  # the system prompt the task is asked under
    tools: list[dict[str, Any]] | None = field(default=None, hash=False)  # the offered tool list
    world: str = ""  # whose tool list and system prompt (a world, or a variant "toolshop~3")
    inner: str = ""  # plain_with_tools: the plain family whose question is asked
    # held_out_world in a build with false starts: the assistant's wrong first call and the
    # tool's answer (message dicts), asked after the user's message; the task is the next call.
    opening: list[dict[str, Any]] | None = field(default=None, hash=False)

    @property
    def messages(self) -> list[Message]:
        head = [Message(role="system", content=self.system)] if self.system else []
        return (head + [Message(role="user", content=self.prompt)]
                + [Message.model_validate(m) for m in self.opening or []])

    def to_json(self) -> dict:
        d = asdict(self)
        for name in _AGENTIC_FIELDS:
            if not d[name]:
                del d[name]
        return {**d, "messages": [m.model_dump(exclude_none=True) for m in self.messages]}


_AGENTIC_FIELDS = ("system", "tools", "world", "inner", "opening")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randrange(3, 6)))


def _problem(family: str, rng: random.Random) -> tuple[str, dict, str]:
    """(canonical key, template fields, answer)."""
    if family in ("add", "sub"):
        a, b = rng.randrange(MAX_NUMBER), rng.randrange(MAX_NUMBER)
        if family == "sub" and b > a:
            a, b = b, a
        return f"{family} {a} {b}", {"a": a, "b": b}, str(a + b if family == "add" else a - b)
    if family == "next":
        n = rng.randrange(MAX_NEXT)
        return f"next {n}", {"n": n}, str(n + 1)
    if family in ("reverse", "upper"):
        w = _word(rng)
        return f"{family} {w}", {"w": w}, w[::-1] if family == "reverse" else w.upper()
    if family == "recall":
        keys = rng.sample(["k1", "k2", "k3", "k4", "k5"], 3)
        vals = [str(rng.randrange(10, 100)) for _ in keys]
        kv = "\n".join(f"{k}={v}" for k, v in zip(keys, vals))
        i = rng.randrange(len(keys))
        return f"recall {kv} {keys[i]}", {"kv": kv, "k": keys[i]}, vals[i]
    raise KeyError(f"unknown OOD family {family!r}; known: {', '.join(FAMILIES)}")


def split_of(key: str) -> str:
    return "eval" if stable_int("ood-split", key) % 100 < EVAL_PERCENT else "train"


def generate(family: str, split: str, n: int, seed: int = 0) -> list[OODTask]:
    """`n` distinct tasks of `family` on `split` ("train" | "eval"), deterministic in `seed`."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    out: list[OODTask] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        rng = random.Random(stable_int("ood", family, seed, i))
        key, fields, answer = _problem(family, rng)
        i += 1
        if key in seen or split_of(key) != split:
            continue
        if i > 50 * n + 1000:
            raise ValueError(f"family {family!r} has too few distinct {split} problems for n={n}")
        seen.add(key)
        prompt = rng.choice(_PROMPTS[family]).format(**fields)
        out.append(OODTask(f"{family}-{seed}-{i - 1}", family, prompt, answer, split, key))
    return out


_END = re.compile(r"(<\|im_end\|>|<\|eot_id\|>|<\|endoftext\|>|</s>)+\s*$")


def normalize(text: str) -> str:
    """Whitespace-insensitive form of an answer: end markers, outer space and one final period
    dropped, inner runs of whitespace collapsed."""
    text = _END.sub("", str(text)).strip()
    text = re.sub(r"\s+", " ", text)
    return text[:-1].rstrip() if text.endswith(".") else text


def check(family: str, answer_text: str, expected: str) -> bool:
    """Exact checker: the answer, normalised, equals the expected answer (case-sensitive)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown OOD family {family!r}; known: {', '.join(FAMILIES)}")
    if not isinstance(answer_text, str):
        return False
    return normalize(answer_text) == normalize(expected)


def write_ood(out_dir: str | Path, n_train: int = 500, n_eval: int = 100, seed: int = 0,
              families: list[str] | None = None,
              extra: dict[str, list[OODTask]] | None = None) -> dict[str, int]:
    """Write `out_dir/train.jsonl` and `out_dir/eval.jsonl` (`families`, default all, then the
    tasks `extra` holds for that split: the agentic-format ones); return the counts."""
    out_dir = Path(out_dir)
    counts = {}
    for split, n in (("train", n_train), ("eval", n_eval)):
        tasks = [t for f in (families or FAMILIES) for t in generate(f, split, n, seed)]
        tasks += (extra or {}).get(split, [])
        counts[split] = write_atomic(out_dir / f"{split}.jsonl", [t.to_json() for t in tasks])
    return counts


def load_ood(path: str | Path) -> list[OODTask]:
    tasks = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                tasks.append(OODTask(d["id"], d["family"], d["prompt"], d["answer"], d["split"],
                                     d.get("key", ""), d.get("system", ""), d.get("tools"),
                                     d.get("world", ""), d.get("inner", ""), d.get("opening")))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not an OOD task record ({exc})") from exc
    return tasks
