"""Where a trained arm loses episodes its reference solved: the eval tasks one checkpoint of a
finished `pivotrl demo` folder solved and another failed (greedy, from its items.jsonl), played
again by both, with a tally of the first call in which the loser leaves the expert's action
(the tool, and the arguments whose values differ) and the transcripts.

    python3 docs/results/demo_full_s2/probe_lost_episodes.py DEMO_DIR WORLD METHOD:SEED:STEP [REF:SEED:STEP] [N]
    # e.g. DEMO_DIR toolshop sft:0:40 base:0:0 12   (REF default base:0:0, N default 12)

The testbed is DEMO_DIR/testbed, the checkpoints DEMO_DIR/runs/WORLD/METHOD/lr*-seedSEED/
checkpoint-STEP (the base: the testbed's). Replays are greedy, so they give the items' outcomes
again (printed, so a mismatch shows)."""
import json
import sys
from collections import Counter
from pathlib import Path

from pivotrl.formats.actions import call_arguments
from pivotrl.io.records import message_text, read_jsonl
from pivotrl_testbed.episodes import ModelPolicy, run_episodes
from pivotrl_testbed.evaluate import load_trajectories, task_of
from pivotrl_testbed.testbed.tiny import load_tiny


def side(spec: str) -> tuple[str, int, int]:
    method, seed, step = spec.split(":")
    return method, int(seed), int(step)


def outcomes(items, world: str, method: str, seed: int, step: int) -> dict[str, float]:
    return {r["item"]: r["outcome"] for r in items
            if (r["split"], r["measure"], r.get("decoding", "greedy")) == ("eval", "episode", "greedy")
            and (r["world"], r["method"], r["seed"], r["step"]) == (world, method, seed, step)}


def model_dir(demo: Path, world: str, method: str, seed: int, step: int) -> Path:
    if method == "base":
        return demo / "testbed" / "base"
    return next((demo / "runs" / world / method).glob(f"lr*-seed{seed}")) / f"checkpoint-{step}"


def calls(messages) -> list[tuple[str, dict]]:
    """(tool, arguments) of every call in the messages (Message records), in order."""
    out = []
    for m in messages:
        for call in m.tool_calls or []:
            try:
                args = call_arguments(call.function.arguments)
            except ValueError:
                args = {"<unparsed>": call.function.arguments}
            out.append((call.function.name, args))
    return out


def first_departure(expert: list[tuple[str, dict]], played: list[tuple[str, dict]]) -> str:
    """The loser's first call that the expert made with other values ("tool: keys"; only the
    arguments both give: the expert adds or leaves out optional ones at random), or its first
    call of a tool the expert never called."""
    by_tool = {}
    for name, args in expert:
        by_tool.setdefault(name, args)
    for name, args in played:
        if name not in by_tool:
            return f"{name}: a tool the expert did not call"
        want = by_tool[name]
        keys = sorted(k for k in set(want) & set(args) if str(want[k]).lower() != str(args[k]).lower())
        if keys:
            return f"{name}: {', '.join(keys)}"
    return "no call departs (the final message or a missing call)"


def transcript(messages) -> str:
    lines = []
    for m in messages[1:]:
        if m.role == "system":
            continue
        text = message_text(m).replace("\n", " ")[:160]
        text += "".join(f" CALL {n}({json.dumps(a)[:120]})" for n, a in calls([m]))
        lines.append(f"    {m.role}: {text}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    demo, world, loser = Path(argv[0]), argv[1], side(argv[2])
    ref = side(argv[3]) if len(argv) > 3 else ("base", 0, 0)
    n = int(argv[4]) if len(argv) > 4 else 12
    items = list(read_jsonl(demo / "items.jsonl"))
    won, lost = outcomes(items, world, *ref), outcomes(items, world, *loser)
    if not won or not lost:
        raise SystemExit(f"{demo / 'items.jsonl'}: no greedy eval episodes for {ref if not won else loser} in {world}")
    tasks = [k for k in won if won[k] == 1 and lost.get(k) == 0]
    print(f"{world}: {ref[0]} solved {sum(won.values()):.0f}, {loser[0]} {sum(lost.values()):.0f} "
          f"of {len(won)}; {len(tasks)} solved by {ref[0]} only; replaying {min(n, len(tasks))}")
    trajs = {t.id: t for t in load_trajectories(demo / "testbed" / world / "eval.jsonl")}
    chosen = [trajs[k] for k in tasks[:n]]
    played = {}
    for spec in (ref, loser):
        model, tok = load_tiny(model_dir(demo, world, *spec))
        policy = ModelPolicy(model, tok, max_new_tokens=96, temperature=0.0, seed=0, batch_size=30)
        played[spec] = run_episodes(world, [task_of(t) for t in chosen], policy)
    tally = Counter()
    for i, traj in enumerate(chosen):
        a, b = played[ref][i], played[loser][i]
        why = first_departure(calls(traj.messages), calls(b.trajectory.messages))
        tally[why] += 1
        print(f"\n=== {traj.id}: {ref[0]} {'won' if a.success else 'LOST on replay'}, "
              f"{loser[0]} {'lost' if not b.success else 'WON on replay'}; departs at {why}")
        print(transcript(b.trajectory.messages))
    print("\nfirst departure from the expert:")
    for why, k in tally.most_common():
        print(f"  {k:3d}  {why}")


if __name__ == "__main__":
    main(sys.argv[1:])
