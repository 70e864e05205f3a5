"""Training: GRPO on pivots (grpo.py, TRL GRPOTrainer), the SFT baseline on the same trajectories
(sft.py, TRL SFTTrainer), the end-to-end RL baseline over whole episodes (e2e.py), their run
configs (config.py) and the verifier reward + metrics (rewards.py).

Nothing heavy is imported here: `import pivotrl.train.grpo` pulls in TRL, only when training.
"""
