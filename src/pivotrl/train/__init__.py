"""Training: GRPO on pivots (grpo.py, TRL GRPOTrainer), the SFT baseline on the same trajectories
(sft.py, TRL SFTTrainer), their run configs (config.py), the verifier reward (reward.py), the
trainer subclass (trainer.py) and its shared-prefix loss (shared_prefix.py), metrics (metrics.py),
re-profiling (reprofile.py) and CPU resume (resume.py). The end-to-end RL baseline is the
testbed's (`pivotrl_testbed.e2e`).

Nothing heavy is imported here: `import pivotrl.train.grpo` pulls in TRL, only when training.
"""
