"""Shared-prefix GRPO log-probs (train/shared_prefix.py) against TRL's own repeated-prompt path:
same per-token log-probs, entropies, loss and every parameter's gradient."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

PAD = 0


def tiny_llama(seed: int = 0, model_type: str = "llama"):
    """A random 2-layer Llama (or Qwen2: q/k/v biases; Qwen3: q/k norms) with grouped-query
    attention, as small as the maths allows."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, vocab_size=96, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=PAD)
    return AutoModelForCausalLM.from_config(config).float().train()


def grpo_batch(prompt_lengths=(9, 14, 6), group=3, seed=0):
    """[left-padded prompts | right-padded completions] for `group` completions per prompt, rows
    shuffled (TRL shuffles a generation batch before splitting it). Prompt lengths differ; one
    prompt starts with the pad id as a real token; one completion is fully masked."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 96) for _ in range(n)] for n in prompt_lengths]
    prompts[0][0] = PAD  # a real token equal to the pad id is not padding
    rows = [(p, [rng.randrange(1, 96) for _ in range(rng.randint(1, 7))]) for p in prompts for _ in range(group)]
    rng.shuffle(rows)
    n_prompt, n_completion = max(prompt_lengths), max(len(c) for _, c in rows)
    ids = torch.full((len(rows), n_prompt + n_completion), PAD)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, n_prompt - len(p):n_prompt] = torch.tensor(p)
        mask[i, n_prompt - len(p):n_prompt] = 1
        ids[i, n_prompt:n_prompt + len(c)] = torch.tensor(c)
        mask[i, n_prompt:n_prompt + len(c)] = 1
    mask[-1, n_prompt:] = 0  # e.g. a truncated completion TRL masked out
    return ids, mask, n_completion


def trl_logps(model, ids, mask, n_completion, batch_size=None, compute_entropy=True):
    """TRL 1.16's own `_get_per_token_logps_and_entropies` (unbound; it only needs an autocast)."""
    from trl import GRPOTrainer

    fake = SimpleNamespace(accelerator=SimpleNamespace(autocast=nullcontext))
    logps, ent, _ = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
        fake, model, ids, mask, n_completion, batch_size=batch_size, compute_entropy=compute_entropy)
    return logps, ent


def prepared(model, causal_lm=None):
    from trl.trainer.utils import add_fused_lm_head

    from pivotrl.train.shared_prefix import enable_shared_prefix_forward

    causal_lm = causal_lm or model
    add_fused_lm_head(causal_lm, outputs=("log_probs", "entropy"))
    assert enable_shared_prefix_forward(causal_lm)
    return model


def grads_of(model, logps, ent, mask, n_completion):
    """Backward through a GRPO-like loss (random per-row advantages, an entropy term)."""
    weights = torch.linspace(-1.0, 1.0, logps.size(0))[:, None]
    cmask = mask[:, -n_completion:].float()
    ((logps * weights + 0.1 * ent) * cmask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return grads


def assert_same(model, ids, mask, n_completion, batch_size=None):
    from pivotrl.train.shared_prefix import shared_prefix_logps

    ref_lp, ref_ent = trl_logps(model, ids, mask, n_completion, batch_size)
    ref_grads = grads_of(model, ref_lp, ref_ent, mask, n_completion)
    lp, ent, _ = shared_prefix_logps(model, ids, mask, n_completion, batch_size, compute_entropy=True)
    grads = grads_of(model, lp, ent, mask, n_completion)

    cmask = mask[:, -n_completion:].bool()
    assert lp.shape == ref_lp.shape and (ref_lp[cmask] != 0).all() and (ref_lp[~cmask] == 0).all()
    assert (lp - ref_lp).abs().max() <= 1e-5
    assert (ent - ref_ent).abs().max() <= 1e-5
    assert ref_grads.keys() == grads.keys() and ref_grads
    for name, ref in ref_grads.items():
        assert ref.abs().max() > 0, f"{name}: no gradient on TRL's path; the check would be vacuous"
        rel = (grads[name] - ref).abs().max() / ref.abs().max()
        assert rel <= 1e-4, f"{name}: gradient differs by {rel:.2e} (relative)"


def test_prefix_groups_key_on_tokens_and_mask():
    from pivotrl.train.shared_prefix import prefix_groups

    ids = torch.tensor([[PAD, 5, 6], [PAD, 5, 6], [7, 5, 6], [PAD, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 1, 1], [0, 1, 1]])
    first, inverse = prefix_groups(ids, mask)
    assert len(first) == 3  # row 1 has a real pad-id token: its own group
    assert inverse[0] == inverse[3] and len({int(inverse[i]) for i in (0, 1, 2)}) == 3
    for u, row in enumerate(first.tolist()):
        assert inverse[row] == u


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_logprobs_entropies_and_gradients_match_trl(model_type):
    model = prepared(tiny_llama(model_type=model_type))
    ids, mask, n_completion = grpo_batch()
    assert_same(model, ids, mask, n_completion)


def test_groups_split_over_chunks_still_match():
    """batch_size 4 over 9 shuffled rows: every group straddles chunks and is encoded per chunk."""
    model = prepared(tiny_llama(1))
    ids, mask, n_completion = grpo_batch(prompt_lengths=(5, 11, 8), seed=1)
    assert_same(model, ids, mask, n_completion, batch_size=4)


def test_lora_gradients_match_trl():
    from peft import LoraConfig, get_peft_model

    base = tiny_llama(2)
    # Random B as well as A: with PEFT's zero-initialised B, A's gradient is zero and proves nothing.
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                 init_lora_weights=False))
    model = prepared(peft_model, peft_model.get_base_model())
    assert any("lora_A" in n for n, p in model.named_parameters() if p.requires_grad)
    ids, mask, n_completion = grpo_batch(seed=2)
    assert_same(model, ids, mask, n_completion)


def test_shared_prefix_encodes_each_prompt_once():
    """The point of it all: the backbone sees each distinct prompt once, not G times."""
    from pivotrl.train.shared_prefix import shared_prefix_logps

    model = prepared(tiny_llama())
    ids, mask, n_completion = grpo_batch(prompt_lengths=(9, 14, 6), group=3)
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, a, out: seen.append(tuple(a[0].shape)))
    try:
        shared_prefix_logps(model, ids, mask, n_completion)
    finally:
        hook.remove()
    n_prompt = ids.size(1) - n_completion
    assert seen == [(3, n_prompt - 1), (9, n_completion + 1)]


def test_the_tokens_counted_are_the_ones_each_path_runs():
    """`train_tokens` (train/tokens.py) counts what the forward computes: under the shared prefix
    each distinct prompt once per chunk (less its last token) plus every row's last prompt token
    and completion; TRL's path every row's prompt and completion. Padding never counts."""
    from pivotrl.train.shared_prefix import shared_prefix_tokens

    ids = torch.tensor([[PAD, 5, 6, 7, 8, 9, PAD],   # prompt A (3 tokens), completion of 2
                        [PAD, 5, 6, 7, 8, PAD, PAD],  # prompt A again, completion of 1
                        [4, 5, 6, 7, 1, 2, 3]])       # prompt B (4 tokens), completion of 3
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    # stage 1: A less its last token (2) + B less its last token (3); stage 2: (1 + 2) + (1 + 1) + (1 + 3)
    assert shared_prefix_tokens(ids, mask, logits_to_keep=3) == 2 + 3 + 3 + 2 + 4
    assert int(mask.sum()) == 16  # TRL's path: A twice
    # one row per chunk: A is encoded in each chunk it appears in
    assert shared_prefix_tokens(ids, mask, logits_to_keep=3, batch_size=1) == (2 + 3) + (2 + 2) + (3 + 4)


def test_generation_still_sees_the_models_signature():
    """`generate` inspects forward's parameters; hiding `logits_to_keep` would make every prefill
    project all prompt positions through the LM head."""
    import inspect

    model = prepared(tiny_llama())
    assert "logits_to_keep" in inspect.signature(model.forward).parameters
    assert model._supports_logits_to_keep()
    out = model.generate(torch.tensor([[5, 6, 7]]), min_new_tokens=3, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)


def _embedding_calls(model, run) -> list[tuple[int, ...]]:
    """The input shapes the model's token embedding saw while `run()` ran (forward and backward)."""
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, a, out: seen.append(tuple(a[0].shape)))
    try:
        run()
    finally:
        hook.remove()
    return seen


def test_gradient_checkpointing_matches_trl_and_recomputes_each_stage():
    """With checkpointing on, log-probs and gradients still equal TRL's (itself checkpointed), and
    the backward recomputes the prompt stage (its cache included) and the completion stage."""
    from pivotrl.train.shared_prefix import shared_prefix_logps, shared_prefix_status

    model = prepared(tiny_llama(4))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    on, line = shared_prefix_status(model)
    assert on and "checkpointed" in line
    ids, mask, n_completion = grpo_batch(seed=4)
    assert_same(model, ids, mask, n_completion)

    def step():
        lp, ent, _ = shared_prefix_logps(model, ids, mask, n_completion, compute_entropy=True)
        grads_of(model, lp, ent, mask, n_completion)

    n_prompt = ids.size(1) - n_completion
    stages = [(3, n_prompt - 1), (9, n_completion + 1)]
    assert _embedding_calls(model, step) == stages + stages[::-1]  # backward recomputes stage 2 first
    model.gradient_checkpointing_disable()
    assert _embedding_calls(model, step) == stages


ARCHITECTURES = ["qwen3_moe", "qwen3_5", "nemotron_h", "gemma3", "granite4", "lfm2"]


def tiny_arch(name: str, seed: int = 1):
    """A tiny random model of `name` (testbed.architectures), weights scaled up from the default
    init so that a wrong state changes log-probs by far more than the tolerance."""
    from pivotrl_testbed.testbed.architectures import build_tiny

    return build_tiny(name, 96, seed=seed, initializer_range=0.2, pad_token_id=PAD).train()


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_architecture_matches_trl(name, checkpointing):
    """MoE, linear-attention and Mamba hybrids, sliding windows, short convolutions: the
    completion stage continues from the prompt's cache of every kind, with and without
    checkpointing (prompts 6-14 tokens, longer than gemma3's 8-token window)."""
    from pivotrl.train.shared_prefix import shared_prefix_status

    model = tiny_arch(name)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = prepared(model)
    assert shared_prefix_status(model)[0]
    ids, mask, n_completion = grpo_batch(seed=5)
    assert_same(model, ids, mask, n_completion)


@pytest.mark.parametrize("name", ["qwen3_5", "nemotron_h", "lfm2"])
def test_completions_start_from_the_prompts_recurrent_state(name):
    """Stage 1's state after a left-padded prompt is the state after the prompt alone (padding
    leaves the recurrence untouched), and the gathered cache hands that state to every completion
    of the prompt."""
    from pivotrl.train.shared_prefix import _gathered, _new_cache

    model = tiny_arch(name).eval()
    ids, mask, _ = grpo_batch(prompt_lengths=(9, 4), group=1, seed=6)
    n = 8  # prompt columns minus the last, as stage 1 sees them
    prompts, pmask = ids[:, :n], mask[:, :n]
    with torch.no_grad():
        batch = _new_cache(model)
        model.base_model(input_ids=prompts, attention_mask=pmask, past_key_values=batch, use_cache=True)
        states = []
        for row in range(2):
            alone = _new_cache(model)
            real = prompts[row, pmask[row].bool()][None]
            model.base_model(input_ids=real, past_key_values=alone, use_cache=True)
            states.append(alone)
    index = torch.tensor([1, 0, 1, 1])
    gathered = _gathered(batch, index)
    checked = 0
    for layer, g_layer, *alone_layers in zip(batch.layers, gathered.layers, *(s.layers for s in states)):
        for kind in ("recurrent_states", "conv_states"):
            for i, state in (getattr(layer, kind, None) or {}).items():
                if state is None:
                    continue
                for row in range(2):  # the batch's row = the prompt alone
                    want = getattr(alone_layers[row], kind)[i][0]
                    assert torch.allclose(state[row], want, atol=1e-5), (kind, row)
                for b, row in enumerate(index.tolist()):  # every completion row starts from it
                    assert torch.equal(getattr(g_layer, kind)[i][b], state[row])
                checked += 1
    assert checked >= 1


@pytest.mark.parametrize("checkpointing", [False, True])
def test_moe_load_balancing_loss_matches_trl(checkpointing):
    """TRL adds the MoE load-balancing loss over every [prompt | completion] token: the shared
    prefix reproduces it (a distinct prompt's tokens weighted by its rows), value and gradients."""
    from trl import GRPOTrainer

    from pivotrl.train.shared_prefix import shared_prefix_logps

    model = tiny_arch("qwen3_moe")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = prepared(model)
    ids, mask, n_completion = grpo_batch(seed=8)
    fake = SimpleNamespace(accelerator=SimpleNamespace(autocast=nullcontext))
    results = {}
    for path in ("trl", "shared"):
        if path == "trl":
            lp, _, aux = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
                fake, model, ids, mask, n_completion, batch_size=5, compute_aux_loss=True)
        else:
            lp, _, aux = shared_prefix_logps(model, ids, mask, n_completion, 5, compute_aux_loss=True)
        ((lp * mask[:, -n_completion:]).sum() + 10.0 * aux).backward()
        results[path] = (aux.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    (ref_aux, ref_grads), (aux, grads) = results["trl"], results["shared"]
    assert ref_aux > 0 and abs(aux - ref_aux) <= 1e-5 * ref_aux
    gate = next(n for n in ref_grads if n.endswith("mlp.gate.weight"))
    assert ref_grads[gate].abs().max() > 0
    for name, ref in ref_grads.items():
        assert (grads[name] - ref).abs().max() <= 1e-4 * ref.abs().max(), name


def test_moe_routing_is_unchanged():
    """Each completion token goes to the same experts (and weights) on both paths."""
    from pivotrl.train.shared_prefix import shared_prefix_logps

    model = prepared(tiny_arch("qwen3_moe"))
    ids, mask, n_completion = grpo_batch(seed=7)
    rows, n_prompt = ids.size(0), ids.size(1) - n_completion
    routed: list = []
    hook = model.model.layers[1].mlp.gate.register_forward_hook(lambda m, a, out: routed.append(out))
    try:
        with torch.no_grad():
            trl_logps(model, ids, mask, n_completion)
            shared_prefix_logps(model, ids, mask, n_completion)
    finally:
        hook.remove()
    (_, ref_w, ref_e), (_, _, _), (_, w, e) = routed  # TRL; then stage 1 (prompts), stage 2
    k = ref_e.size(-1)
    ref_w, ref_e = ref_w.view(rows, -1, k)[:, n_prompt - 1:], ref_e.view(rows, -1, k)[:, n_prompt - 1:]
    w, e = w.view(rows, -1, k), e.view(rows, -1, k)
    real = mask[:, n_prompt - 1:].bool()
    assert torch.equal(e[real], ref_e[real])
    assert torch.allclose(w[real], ref_w[real], atol=1e-6)
    assert len(set(e[real].flatten().tolist())) > 1  # the tokens do go to different experts


def _trainer_loss_both_ways(trainer, vocab: int, monkeypatch, switch: bool):
    """compute_loss + gradients on one micro-batch of 9 rows (3 prompts x 3), on TRL's path and
    then with the trainer's switch: ((loss, grads) on TRL's, (loss, grads) on the switch's, calls
    into the shared-prefix path)."""
    from pivotrl.train import shared_prefix
    from pivotrl.train import trainer as trainer_module

    ids, mask, n_completion = grpo_batch(prompt_lengths=(30, 41, 25))
    ids = ids % vocab
    n_prompt = ids.size(1) - n_completion
    inputs = {"prompt_ids": ids[:, :n_prompt], "prompt_mask": mask[:, :n_prompt],
              "completion_ids": ids[:, n_prompt:], "completion_mask": mask[:, n_prompt:],
              "advantages": torch.linspace(-1.0, 1.0, ids.size(0)), "old_per_token_logps": None,
              "num_items_in_batch": mask[:, n_prompt:].sum().float()}
    model = trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() in a real run
    calls = []
    monkeypatch.setattr(trainer_module, "shared_prefix_logps",
                        lambda *a, **k: calls.append(1) or shared_prefix.shared_prefix_logps(*a, **k))

    def losses_and_grads(on: bool):
        trainer.shared_prefix = on and switch
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return loss.detach(), grads

    reference = losses_and_grads(False)
    assert not calls
    return reference, losses_and_grads(True), calls


def _assert_same_loss(reference, shared):
    (ref_loss, ref_grads), (loss, grads) = reference, shared
    assert ref_loss != 0 and abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    assert grads.keys() == ref_grads.keys() and grads
    for name, ref in ref_grads.items():
        assert (grads[name] - ref).abs().max() <= 1e-4 * ref.abs().max(), name


@pytest.mark.parametrize("switch,checkpointing", [(True, False), (False, False), (True, True)])
def test_trainer_loss_and_gradients_match_with_the_switch(tiny_model_dir, tmp_path, monkeypatch, switch,
                                                          checkpointing):
    """PivotGRPOTrainer's GRPO loss on one micro-batch: shared-prefix path == TRL's path (with
    gradient checkpointing too); with the switch off the trainer never takes the shared-prefix path."""
    from transformers import AutoTokenizer

    from pivotrl.train.grpo import build_trainer, load_pivot_set
    from tests.test_train_grpo import small_config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = small_config(tmp_path, tiny_model_dir, shared_prefix_loss=switch, num_generations=3,
                       per_device_train_batch_size=9, gradient_checkpointing=checkpointing)
    trainer = build_trainer(cfg, load_pivot_set(cfg), reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                            tokenizer=tok)
    assert trainer.shared_prefix is switch
    if checkpointing:  # as Trainer.train() turns it on, with the run's arguments
        trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
    assert trainer._causal_lm(trainer.model).is_gradient_checkpointing is checkpointing
    reference, shared, calls = _trainer_loss_both_ways(trainer, len(tok), monkeypatch, switch)
    assert bool(calls) is switch
    _assert_same_loss(reference, shared)


def test_moe_checkpoint_with_router_logits_on_trains_through_the_shared_prefix(tiny_model_dir, tmp_path,
                                                                               monkeypatch):
    """A Qwen3-MoE saved with `output_router_logits: true` (as real checkpoints ship): the trainer's
    GRPO loss, router aux loss included, is TRL's own path's, value and gradients."""
    from transformers import AutoConfig, AutoTokenizer

    from pivotrl.train.grpo import build_trainer, load_pivot_set
    from pivotrl_testbed.testbed.architectures import save_tiny_arch
    from tests.test_train_grpo import small_config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = save_tiny_arch("qwen3_moe", tok, tmp_path / "moe")
    config = AutoConfig.from_pretrained(path)
    config.output_router_logits, config.router_aux_loss_coef = True, 0.5  # a coefficient the check can see
    config.save_pretrained(path)
    cfg = small_config(tmp_path, path, num_generations=3, per_device_train_batch_size=9)
    trainer = build_trainer(cfg, load_pivot_set(cfg), reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                            tokenizer=tok)
    assert trainer.shared_prefix and trainer.aux_loss_enabled
    reference, shared, calls = _trainer_loss_both_ways(trainer, len(tok), monkeypatch, True)
    assert calls
    assert trainer._metrics["train"]["aux_loss"][-1] > 0
    _assert_same_loss(reference, shared)


def test_kl_reference_logprobs_take_the_shared_prefix_too(tiny_model_dir, tmp_path):
    """beta > 0: TRL's separate reference model gets the shared-prefix forward as well, same numbers."""
    from transformers import AutoTokenizer

    from pivotrl.train.grpo import build_trainer, load_pivot_set
    from pivotrl.train.shared_prefix import has_shared_prefix_forward
    from tests.test_train_grpo import small_config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = small_config(tmp_path, tiny_model_dir, beta=0.04)
    trainer = build_trainer(cfg, load_pivot_set(cfg), reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                            tokenizer=tok)
    assert trainer.ref_model is not None and has_shared_prefix_forward(trainer._causal_lm(trainer.ref_model))
    ids, mask, n_completion = grpo_batch(prompt_lengths=(30, 41, 25))
    ids = ids % len(tok)
    with torch.no_grad():
        shared, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask, n_completion)
        reference, _ = trl_logps(trainer.ref_model, ids, mask, n_completion, compute_entropy=False)
    assert (reference[mask[:, -n_completion:].bool()] != 0).all()
    assert (shared - reference).abs().max() <= 1e-5


def _ddp_worker(rank: int, world: int, out_dir: str) -> None:
    """One DDP rank: shared-prefix log-probs through the DDP wrapper on this rank's batch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from pivotrl.train.shared_prefix import shared_prefix_logps

    torch.set_num_threads(1)
    # A rendezvous file, not a TCP port: nothing another process on the machine can take first.
    # A collective that waits longer than the timeout raises instead of hanging the suite.
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        ids, mask, n_completion = grpo_batch(seed=10 + rank)
        for find_unused in (False, True):
            model = prepared(tiny_llama(3))
            ddp = DistributedDataParallel(model, find_unused_parameters=find_unused)
            lp, ent, _ = shared_prefix_logps(ddp, ids, mask, n_completion, compute_entropy=True)
            grads = grads_of(model, lp, ent, mask, n_completion)  # DDP averaged them over the ranks
            torch.save(grads, f"{out_dir}/rank{rank}_unused{int(find_unused)}.pt")
    finally:
        dist.destroy_process_group()


def run_two_ranks(module: str, worker: str, out_dir: Path) -> None:
    """`module.worker(rank, 2, out_dir)` in two fresh interpreters (gloo ranks), each killed at a
    deadline; both must exit 0.
    Each rank is a fresh interpreter, not a fork of this one: a fork of a process with threads
    (torch's pools, pytest plugins) can deadlock, and a rank that hangs is killed at the deadline
    instead of outliving the test. os._exit after the worker returns: at interpreter teardown
    gloo's threads sometimes abort ("terminate called without an active exception", exit -6)
    after all the work is saved."""
    tests = Path(__file__).resolve().parent
    script = (f"import os, sys; from {module} import {worker}; "
              f"{worker}({{}}, 2, {str(out_dir)!r}); sys.stdout.flush(); os._exit(0)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests), os.environ.get("PYTHONPATH", "")])}
    ranks = [subprocess.Popen([sys.executable, "-c", script.format(rank)], cwd=tests, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    try:
        logs = [p.communicate(timeout=240)[0] for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in ranks] == [0, 0], "\n".join(log[-3000:] for log in logs)


def test_ddp_syncs_shared_prefix_gradients(tmp_path):
    """Under DDP (2 gloo processes, different batches) the shared-prefix forward is ONE call of
    the wrapped model: the all-reduced gradients equal the mean of TRL's per-rank gradients, with
    and without find_unused_parameters."""
    run_two_ranks("test_shared_prefix", "_ddp_worker", tmp_path)
    model = prepared(tiny_llama(3))
    per_rank = []
    for rank in range(2):
        ids, mask, n_completion = grpo_batch(seed=10 + rank)
        lp, ent = trl_logps(model, ids, mask, n_completion)
        per_rank.append(grads_of(model, lp, ent, mask, n_completion))
    for find_unused in (0, 1):
        synced = [torch.load(tmp_path / f"rank{r}_unused{find_unused}.pt") for r in range(2)]
        for name, g0 in per_rank[0].items():
            expected = (g0 + per_rank[1][name]) / 2
            assert not torch.allclose(g0, per_rank[1][name]), name  # the ranks really differ
            for got in synced:
                assert (got[name] - expected).abs().max() <= 1e-4 * expected.abs().max(), (name, find_unused)


def test_shared_rollouts_prefill_each_prompt_once_and_follow_the_seed(tiny_model_dir, tmp_path, monkeypatch):
    """The trainer's rollouts through pivotrl's generation loop: the G copies of a prompt are
    prefilled once (the embedding's first call sees distinct prompts only), completions end at
    the end token, and the same torch seed draws the same completions."""
    from transformers import AutoTokenizer

    from pivotrl.train.grpo import build_trainer, load_pivot_set
    from pivotrl.train.shared_prefix import rollout_fallback_reason, shared_prefill_rollouts
    from tests.test_train_grpo import small_config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = small_config(tmp_path, tiny_model_dir, num_generations=4, per_device_train_batch_size=8,
                       shared_rollouts=True)
    trainer = build_trainer(cfg, load_pivot_set(cfg), reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                            tokenizer=tok)
    assert rollout_fallback_reason(trainer) is None and trainer.shared_rollouts
    prompts = [tok(f"<|im_start|>user\nOrder O-{i}<|im_end|>\n<|im_start|>assistant\n",
                   add_special_tokens=False)["input_ids"] for i in range(2)]
    rows = [p for p in prompts for _ in range(4)]

    def draw():
        torch.manual_seed(3)
        return shared_prefill_rollouts(trainer, rows)

    calls = _embedding_calls(trainer.model, draw)
    assert calls[0] == (2, max(map(len, prompts)))  # one prefill per distinct prompt
    first, again = draw(), draw()
    assert first == again and len(first) == 8
    assert all(0 < len(c) <= cfg.max_completion_length for c in first)
    assert all(c[-1] in trainer.eos_token_ids for c in first if len(c) < cfg.max_completion_length)
    assert len({tuple(c) for c in first[:4]}) > 1  # a prompt's samples follow their own seeds
    from pivotrl.train import trainer as trainer_module

    drawn = []
    monkeypatch.setattr(trainer_module, "shared_prefill_rollouts",
                        lambda t, ids: drawn.append(len(ids)) or shared_prefill_rollouts(t, ids))
    trainer.args.max_steps = 1
    trainer.train()  # a step whose rollouts come from the shared-prefill loop
    assert trainer.state.global_step == 1 and drawn == [8]


def test_rollouts_stay_trls_where_the_loop_would_sample_otherwise():
    from pivotrl.train.shared_prefix import rollout_fallback_reason

    def trainer(**kw):
        args = SimpleNamespace(use_vllm=kw.pop("use_vllm", False), generation_kwargs=kw.pop("generation_kwargs", None))
        return SimpleNamespace(args=args, **{"temperature": 1.0, "top_k": 0, "min_p": None,
                                             "repetition_penalty": 1.0, **kw})

    assert rollout_fallback_reason(trainer()) is None
    assert "vLLM" in rollout_fallback_reason(trainer(use_vllm=True))
    assert "multimodal" in rollout_fallback_reason(trainer(_is_vlm=True))
    for kw in ({"top_k": 50}, {"min_p": 0.1}, {"repetition_penalty": 1.1}, {"generation_kwargs": {"x": 1}}):
        assert "sampling options" in rollout_fallback_reason(trainer(**kw)), kw
