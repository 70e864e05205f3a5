"""The default testbed: the recipe of the base `pivotrl demo` runs on, and why it is this one.

`TestbedConfig()`'s field defaults are the plain recipe: a 2-layer base pretrained on the worlds
themselves, which already knows them, so no arm can teach it anything (docs/RESULTS.md, Runs 10
and 11); the tests' quick builds shrink it. The default testbed is another recipe, chosen among
candidates by acceptance criteria committed before any of them was built (docs/RESULTS.md,
"Acceptance criteria for a base with headroom", then "... whose missing skill costs tasks"), on
dev, on one machine: candidate S2, the first to meet criteria 2 to 6 of the first list, then
candidate Z, the first to meet the second list as amended.

What it is, in the order the choice was made (each step measured there):
- the base meets toolshop and terminal only as 2,000 renamed variants of each world (other tool
  names, argument keys and system prompts; the worlds' own names one choice of each, never the
  whole list), so what the demo's 100 trajectories teach is in no pretraining example;
- its tokenizer keeps each quoted identifier one token and spells values out, so a name or an
  e-mail in the tool list or the request is copied token for token;
- the weak expert opens 7 tasks in 10 with a false start (a wrong first call, then the right
  one): a habit at the turn every task has, which the worlds' expert never shows and SFT undoes;
- three agentic-format OOD families in the mix (a plain answer with tools offered, a request no
  tool fits, a held-out world), so narrowing on the worlds can show up as forgetting;
- 4 layers of 8 heads (1.1 M parameters), 16,200 steps on seed 2 (candidate R3), then a
  4,000-step stage at lr 3e-4 on new tasks whose variants use the worlds' own names 7 times in 10
  (`pretrain_stages`): R3's samples at T = 1 wrote the variants' names where the list offered the
  world's, and q at toolshop's opening and fifth turn was below 0.1. That much is S2, whose
  weights ship beside the default's (`shipped_s2/`), since the last stage starts from them.
- The last stage makes it candidate Z, the base whose missing step costs whole tasks
  (docs/RESULTS.md, "The pivot criterion as it was meant"): 1,000 steps on new tasks whose weak
  expert, in 65% of its trajectories, writes every value the request names as its own default
  (terminal) or takes the listing's first order (toolshop), with no habitual form among
  equivalent ones and a tenth of OOD rehearsal. S2's headroom was a habit the base recovered
  from within the episode, so no arm won tasks on it; on Z, SFT on the demo's data raises dev
  episode success by +0.175 (toolshop) and +0.225 (terminal), measured before any other arm ran.
"""

# The recipe as TestbedConfig fields (`build.load_testbed_config(None)` validates it; configs/testbed.yaml
# writes it out). Plain data: this module imports nothing, so the build can read it.
DEFAULT_RECIPE = {
    "variants": 2000, "variant_names": "shared", "variant_own_share": 0.3, "variant_prompts": "composed",
    "tokenizer_isolate_names": True, "tokenizer_spell_values": True, "ood_repeat": 6,
    "agentic_ood_families": ["plain_with_tools", "no_tool_fits", "held_out_world"],
    "weak_false_starts": 0.7,
    "model": {"num_layers": 4, "num_heads": 8, "seed": 2},
    "pretrain": {"steps": 16200, "seed": 2},
    "pretrain_stages": [{
        "data": {"variant_own_share": 0.7, "weak_seed": 11, "weak_task_start": 200_000},
        "pretrain": {"steps": 4000, "lr": 3e-4, "warmup": 100, "seed": 11}}, {
        "data": {"variant_own_share": 0.7, "weak_grounding_slips": 0.65,
                 "weak_grounding_terminal": "request", "weak_noise": 0.05, "ood_repeat": 1,
                 "ood_fraction": 0.1, "weak_false_starts": 0.0, "weak_habit": 0.0,
                 "weak_seed": 14, "weak_task_start": 500_000},
        "pretrain": {"steps": 1000, "lr": 3e-4, "warmup": 50, "seed": 14}}],
}
