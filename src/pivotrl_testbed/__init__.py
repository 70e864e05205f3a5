"""The experiment: the built-in testbed (worlds, experts, OOD tasks, tiny model), the episode
runner, evaluation, the end-to-end RL baseline, BFCL, the demo, its report and theory checks.

It imports the core (`pivotrl.*` outside this package); the core never imports it.
"""
