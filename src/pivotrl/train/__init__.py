"""Training: GRPO on pivots (grpo.py, TRL GRPOTrainer), the SFT baseline on the same trajectories
(sft.py, TRL SFTTrainer), the end-to-end RL baseline over whole episodes (e2e.py), their run
configs (config.py), the verifier reward (reward.py), the trainer subclass (trainer.py), its metrics
(metrics.py) and re-profiling (reprofile.py).

Nothing heavy is imported here: `import pivotrl.train.grpo` pulls in TRL, only when training.
"""
