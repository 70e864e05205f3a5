"""The end-to-end RL baseline: GRPO over whole multi-turn episodes, reward = the world's success.

Why a plain loop and not TRL: TRL 1.16's multi-turn support (`GRPOTrainer(environment_factory=…)`
/ `tools=`) runs tools itself inside `generate`: it parses tool calls with the tokenizer's own
response schema, calls the environment's Python methods by name and appends their results in its
own format. Our worlds are driven by the shared episode runner (`episodes.run_episodes`), whose
rules (one parser for every stage, an invalid action ends the episode as a failure, a turn cap,
success judged by the world) are the ones PivotRL is evaluated under; re-implementing them as a
TRL environment would be a second, diverging harness. `rollout_func` could wrap the runner, but
it is experimental in 1.16 and expects one prompt → one completion token sequence, while an
episode is several model turns separated by tool output that must be masked out. So this is the
loop below, on the same optimizer settings as `pivotrl train` (AdamW, lr, warmup then constant,
grad clip, clip ε 0.2/0.28, group-normalised advantages, token-level "dapo" normalisation, no
KL), one process, CleanRL style.

The loss covers every token the model generated in the episode (all its turns); prompts, and so
tool results, are never in the loss. An episode's turns are scored in one pass over its last
sequence when the template replays them exactly (`pack_turns`). Every model turn generated is
counted (`rollout_turns`), the unit in which PivotRL's one-turn rollouts are counted too, and so
are the tokens the model generated (`rollout_tokens`) and the tokens of every forward pass a
backward follows (`train_tokens`: each packed sequence's length, once per iteration; the old
policy's no-gradient pass is not counted), as pivotrl's trainers count them (train/tokens.py).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pivotrl.formats.chat import completion_text, prompt_text
from pivotrl_testbed.episodes import EpisodeResult, run_episodes
from pivotrl.sampling.generate import completion_logps, generate_each, span_logps, stop_ids
from pivotrl.io.inputs import check_input_file, check_model
from pivotrl.io.run_folder import claim_run_folder, finish_run, start_run
from pivotrl.io.progress import ProgressLog
from pivotrl.io.records import Message, Reject, Trajectory, read_records, rejects_path, write_atomic
from pivotrl.io.seeds import derive_seed
from pivotrl.io.split import HeldOut, resolve_split, split_file
from pivotrl.io.run_plan import Launch, RunPlan
from pivotrl.train.plan import begin_training
from pivotrl.train.run_card import RL_REPORT, run_facts, write_run_report
from pivotrl_testbed.e2e_config import E2ERunConfig


class RecordingPolicy:
    """Samples each turn with the current model and keeps the exact token ids per episode.

    Episodes are told apart by their message list: `run_episodes` hands the policy each episode's
    own (growing) list, all of them on its first call, in task order."""

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float, seed: int):
        self.model, self.tok = model, tokenizer
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.episode_of: dict[int, int] = {}
        self.turns: list[list[tuple[list[int], list[int]]]] = []  # episode → [(prompt ids, completion ids)]
        self.calls = 0

    def act_batch(self, contexts: list[list[Message]], tools: list[list[dict[str, Any]]]) -> list[str]:
        prompts = [self.tok(prompt_text(self.tok, c, t), add_special_tokens=False)["input_ids"]
                   for c, t in zip(contexts, tools)]
        # The G episodes of a task open with the same prompt: generate_each prefills it once.
        # Each context has its own seed, so an episode's samples do not depend on the others.
        gens = generate_each(self.model, prompts,
                             [derive_seed(self.seed, self.calls, i) for i in range(len(prompts))],
                             max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                             stop_token_ids=stop_ids(self.tok, self.model),
                             batch_size=max(1, len(prompts)),
                             window=getattr(self.model.config, "max_position_embeddings", None))
        self.calls += 1
        texts = []
        for context, prompt, gen in zip(contexts, prompts, gens):
            # Too long for the window: no tokens, an empty text (an invalid action). The end
            # token stays in the recorded completion: the model must learn to stop.
            completion = gen.tokens
            episode = self.episode_of.setdefault(id(context), len(self.episode_of))
            if episode == len(self.turns):
                self.turns.append([])
            self.turns[episode].append((prompt, completion))
            body = completion[:-1] if gen.finish_reason == "stop" else completion
            texts.append(completion_text(self.tok, body))
        return texts


# The LM head on completion positions only (shared with the rest of the package).
token_logps = completion_logps


def pack_turns(turns: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """An episode's (prompt, completion) turns as few sequences as possible: a turn whose prompt
    starts with the previous sequence token for token (the chat template re-renders the earlier
    turns exactly as sampled) is appended to it as one more (start, length) span. A causal model
    reads the span there as in its own pass, so the loss is the same for a fraction of the tokens
    (the later prompts repeat every earlier turn). Templates that rewrite history (dropped
    reasoning, re-tokenised text) start a new sequence. Empty completions are not in the loss."""
    packed: list[tuple[list[int], list[tuple[int, int]]]] = []
    for prompt, completion in turns:
        if not completion:
            continue
        if packed and len(prompt) >= len(packed[-1][0]) and prompt[:len(packed[-1][0])] == packed[-1][0]:
            packed[-1] = (prompt + completion, packed[-1][1] + [(len(prompt), len(completion))])
        else:
            packed.append((prompt + completion, [(len(prompt), len(completion))]))
    return packed


# Beside the weights in every checkpoint-N: what a resumed run needs to continue exactly.
RESUME_STATE = "e2e_state.pt"


def latest_checkpoint(out: Path) -> tuple[int, Path] | None:
    """(step, dir) of the last checkpoint a run can resume from, None when there is none."""
    done = [(int(p.name.rsplit("-", 1)[1]), p) for p in out.glob("checkpoint-*")
            if p.name.rsplit("-", 1)[1].isdigit() and (p / RESUME_STATE).is_file()]
    return max(done) if done else None


def world_of(cfg: E2ERunConfig, task: Trajectory) -> str:
    world = cfg.world or task.metadata.get("world") or task.domain
    if not world:
        raise ValueError(f"task {task.id}: no world (set `world:` in the run config or metadata.world)")
    return world


def runnable_tasks(cfg: E2ERunConfig, tasks: list[Trajectory]) -> tuple[list[Trajectory], int]:
    """The tasks an episode can run for (their world is registered), and how many were not."""
    from pivotrl.verifiers.world import make_world

    known: dict[str, bool] = {}
    kept = []
    for task in tasks:
        try:
            world = world_of(cfg, task)
        except ValueError:
            continue
        if world not in known:
            try:
                make_world(world)
                known[world] = True
            except KeyError:
                known[world] = False
        if known[world]:
            kept.append(task)
    return kept, len(tasks) - len(kept)


def load_tasks(cfg: E2ERunConfig) -> tuple[list[Trajectory], dict[str, Any]]:
    """The configured tasks less held-out trajectories (the split) and tasks with no world to run
    in; what was dropped is counted in the second value. A bad line is skipped and counted, as
    `sft` does, its reason in OUTPUT_DIR/tasks.rejects.jsonl (file, line, field)."""
    files = cfg.tasks if isinstance(cfg.tasks, list) else [cfg.tasks]
    for path in files:
        check_input_file(path, "tasks", "`pivotrl testbed build` (DIR/<world>/train.jsonl)")
    held_out = HeldOut(resolve_split(cfg.split, files))
    tasks, rejects = [], []
    for rec in (rec for f in files for _, rec in read_records(f, Trajectory)):
        if isinstance(rec, Reject):
            rejects.append(rec)
        elif held_out.keep(rec.id):
            tasks.append(rec)
    rejected = {}
    if rejects:
        path = rejects_path(Path(cfg.output_dir) / "tasks.jsonl")
        write_atomic(path, [r.to_json() for r in rejects])
        rejected = {"rejected_lines": f"{len(rejects)} (first: {rejects[0]}; all in {path})"}
    tasks, no_world = runnable_tasks(cfg, tasks)
    if not tasks:
        raise ValueError(f"{cfg.tasks}: no task to run ({held_out.dropped} held out, {no_world} with no "
                         f"registered world: set `world:` or metadata.world, {len(rejects)} bad lines)")
    return tasks, {"held_out": held_out.summary(), "held_out_records": held_out.dropped, "no_world": no_world,
                   **rejected}


def e2e_plan(cfg: E2ERunConfig, tasks: int, held_out: int, no_world: int,
             resume: tuple[int, Path] | None) -> RunPlan:
    """The run's plan: max_steps steps of tasks_per_step tasks, G episodes each (a pass over the
    tasks is reshuffled when it runs out, so any number of tasks fills a step)."""
    return RunPlan(verb="e2e", unit="tasks", items=tasks, read=tasks + held_out + no_world, dropped=no_world,
                   held_out=held_out,
                   steps=cfg.max_steps, per_step=cfg.tasks_per_step,
                   completions_per_step=cfg.tasks_per_step * cfg.num_generations,
                   token_budget={"max_completion_length (per turn)": cfg.max_completion_length,
                                 "max_turns": cfg.max_turns},
                   epochs=cfg.max_steps * cfg.tasks_per_step / tasks if tasks else None,
                   resume_from=resume[1].name if resume else None,
                   details={"episodes_per_task": cfg.num_generations})


def train_e2e(cfg: E2ERunConfig, tasks: list[Trajectory] | None = None,
              reward_fn: Callable[[EpisodeResult], float] | None = None,
              launch: Launch | None = None) -> dict[str, Any]:
    """Run the baseline; writes metrics.jsonl (reward vs rollout turns) and the final model.
    `reward_fn` replaces the world's success (0/1) as the episode reward (shaping experiments).
    The plan is printed and saved first; `launch.dry_run` stops there, writing nothing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output_dir)
    dry_run = bool(launch and launch.dry_run)
    files = cfg.tasks if isinstance(cfg.tasks, list) else [cfg.tasks]
    claim_run_folder(out, model=cfg.model, inputs=[*files, cfg.split], resume=cfg.resume, overwrite=cfg.overwrite,
                     dry_run=dry_run)
    dropped: dict[str, Any] = {}
    read = tasks is None  # tasks handed in by the caller are not read from cfg.tasks
    if read:
        tasks, dropped = load_tasks(cfg)
    if not tasks:
        raise ValueError(f"{cfg.tasks}: no tasks")
    check_model(cfg.model, "model")
    start_run(out, "e2e", {"tasks": files, "split": split_file(cfg.split, files)} if read else {},
              resume=cfg.resume, dry_run=dry_run)
    resume = latest_checkpoint(out) if cfg.resume and out.is_dir() else None
    plan = e2e_plan(cfg, len(tasks), dropped.get("held_out_records", 0), dropped.get("no_world", 0), resume)
    if not begin_training(plan, cfg, launch):
        return {"dry_run": True, "plan": plan.as_dict()}
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    model = AutoModelForCausalLM.from_pretrained(resume[1] if resume else cfg.model, dtype=torch.float32)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    warmup = max(cfg.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
    metrics_path = out / "metrics.jsonl"
    order: list[int] = []  # indices into tasks: the rest of the current pass, popped from the end
    rollout_turns, G, done = 0, cfg.num_generations, 0
    # None: unknown (resumed from a checkpoint that did not keep them), then never logged.
    tokens: dict[str, int | None] = {"train_tokens": 0, "rollout_tokens": 0}
    if resume:
        done, state = resume[0], torch.load(resume[1] / RESUME_STATE, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        order, rollout_turns = state["order"], state["rollout_turns"]
        tokens = {k: state.get(k) for k in tokens}
        # metrics of steps after the checkpoint were never kept in the model: drop them
        rows = metrics_path.read_text().splitlines() if metrics_path.exists() else []
        metrics_path.write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= done))
    else:
        metrics_path.write_text("")
    progress = ProgressLog("step", cfg.max_steps, every_s=cfg.progress_seconds, log_file=out / "train.log",
                           start=done)
    facts = run_facts("e2e", cfg, data={"tasks": ", ".join(map(str, files)) if read else "handed in by the caller",
                                        "split": split_file(cfg.split, files) if read else None},
                      held_out=f"{dropped.get('held_out_records', 0)} records of eval trajectories dropped",
                      items=f"{len(tasks)} tasks", command=launch.command if launch else None,
                      settings={"episodes per task (num_generations)": G, "tasks per step": cfg.tasks_per_step,
                                "max_turns": cfg.max_turns, "max_completion_length": cfg.max_completion_length,
                                "temperature": cfg.temperature})

    for step in range(done + 1, cfg.max_steps + 1):
        t0 = time.perf_counter()
        # 1. Tasks for this step: a reshuffled pass over the task list, tasks_per_step at a time.
        batch_tasks = []
        while len(batch_tasks) < cfg.tasks_per_step:
            if not order:
                order = rng.sample(range(len(tasks)), len(tasks))
            batch_tasks.append(tasks[order.pop()])

        # 2. G episodes per task with the current policy (sampling, no gradients).
        model.eval()
        # One runner call (and one recorder: it tells episodes apart by their live message lists)
        # per world; tasks sorted by world, so each group of G episodes stays contiguous.
        batch_tasks.sort(key=lambda t: world_of(cfg, t))
        results, episode_turns = [], []
        for w, world in enumerate(dict.fromkeys(world_of(cfg, t) for t in batch_tasks)):
            group = [t for t in batch_tasks if world_of(cfg, t) == world]
            policy = RecordingPolicy(model, tokenizer, cfg.max_completion_length, cfg.temperature,
                                     seed=(cfg.seed * 100_003 + step) * 31 + w)
            got = run_episodes(world, [t for t in group for _ in range(G)], policy, cfg.max_turns)
            if len(policy.turns) != len(got) or any(len(policy.turns[i]) != r.model_turns
                                                    for i, r in enumerate(got)):
                raise RuntimeError("episode runner and recording policy disagree on the turns played")
            results += got
            episode_turns += policy.turns
        model_turns = sum(r.model_turns for r in results)
        rollout_turns += model_turns
        generated = sum(len(completion) for turns in episode_turns for _, completion in turns)

        # 3. Group-normalised advantages: reward = success (0/1), one group = G episodes of a task.
        rewards = torch.tensor([float(reward_fn(r) if reward_fn else r.success) for r in results]).view(-1, G)
        # The sample std (Bessel-corrected), as TRL's GRPOTrainer normalises PivotRL's groups: the
        # two RL arms must scale their advantages the same way.
        std = rewards.std(dim=1, unbiased=True, keepdim=True)
        advantages = ((rewards - rewards.mean(dim=1, keepdim=True)) / (std + 1e-4)).view(-1)

        # 4. Token-level clipped policy gradient over every generated token of every episode.
        samples = [(ids, spans, advantages[i].item())
                   for i, turns in enumerate(episode_turns) for ids, spans in pack_turns(turns)]
        total_tokens = max(1, sum(n for _, spans, _ in samples for _, n in spans))  # "dapo": all tokens
        learn = [s for s in samples if s[2] != 0.0]  # zero advantage: zero gradient, skip the forward
        model.train()
        chunks = [learn[k:k + cfg.micro_batch_size] for k in range(0, len(learn), cfg.micro_batch_size)]
        micro_batches = [[(ids, spans) for ids, spans, _ in chunk] for chunk in chunks]
        micro_advantages = [[adv for _, spans, adv in chunk for _ in spans] for chunk in chunks]
        old: list[list[torch.Tensor]] = []  # per micro-batch, per span: the sampling policy's
        if cfg.num_iterations > 1:
            with torch.no_grad():
                old = [span_logps(model, micro, cfg.temperature) for micro in micro_batches]
        loss_sum, clipped, grad_norm, trained = 0.0, 0, 0.0, 0
        for _ in range(cfg.num_iterations):
            optimizer.zero_grad(set_to_none=True)
            for m, (micro, span_advantages) in enumerate(zip(micro_batches, micro_advantages)):
                new = span_logps(model, micro, cfg.temperature)
                trained += sum(len(ids) for ids, _ in micro)  # unpadded: each sequence's own length
                loss = torch.zeros((), device=model.device)
                for j, (lp, adv) in enumerate(zip(new, span_advantages)):
                    ratio = torch.exp(lp - (old[m][j] if old else lp.detach()))
                    clipped_ratio = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon_high)
                    loss = loss - torch.min(ratio * adv, clipped_ratio * adv).sum()
                    clipped += int((ratio != clipped_ratio).sum())
                (loss / total_tokens).backward()
                loss_sum += loss.item() / total_tokens
            if learn:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            optimizer.step()  # no gradients (all groups zero-std): a no-op that keeps the schedule
            scheduler.step()
        for key, n in (("train_tokens", trained), ("rollout_tokens", generated)):
            tokens[key] = None if tokens[key] is None else tokens[key] + n

        # 5. Log reward against rollout turns spent; checkpoint.
        if step % cfg.logging_steps == 0 or step == cfg.max_steps:
            row = {"step": step, "reward_mean": rewards.mean().item(), "reward_std": rewards.std(unbiased=False).item(),
                   "group_std_mean": std.mean().item(), "frac_zero_std": (std < 1e-6).float().mean().item(),
                   "invalid_rate": sum(r.invalid_actions for r in results) / max(1, model_turns),
                   "rollout_turns": rollout_turns, "episode_turns_mean": model_turns / len(results),
                   "loss": loss_sum / cfg.num_iterations, "grad_norm": grad_norm,
                   "clip_ratio": clipped / total_tokens / cfg.num_iterations,
                   "learning_rate": scheduler.get_last_lr()[0], "step_time": time.perf_counter() - t0,
                   **{k: n for k, n in tokens.items() if n is not None}}
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        progress.update(step, f"reward {rewards.mean().item():.3g}")
        if step % cfg.save_steps == 0:
            ckpt = out / f"checkpoint-{step}"
            model.save_pretrained(ckpt)
            tokenizer.save_pretrained(ckpt)
            write_run_report(facts.model_copy(update={"steps": step, "finished": False}), RL_REPORT)
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "order": order,
                        "rollout_turns": rollout_turns, **tokens}, ckpt / RESUME_STATE)

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    report = write_run_report(facts.model_copy(update={"steps": cfg.max_steps}), RL_REPORT)
    finish_run(out)
    return {"steps": cfg.max_steps, "resumed_from": done, "tasks": len(tasks), **dropped, "rollout_turns": rollout_turns,
            **tokens, "output_dir": str(out), "metrics": str(metrics_path), **report}
