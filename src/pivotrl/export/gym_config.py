"""The NeMo-Gym server config that serves exported pivot rows (`rows.gym_config.yaml`): per
agent, an agent block reading the rows and the argument-comparison resources server it routes to."""

from __future__ import annotations

from typing import Any

from pivotrl.io.records import sidecar_path


def gym_config_path(out: Any) -> Any:
    """`rows.jsonl` -> `rows.gym_config.yaml`, next to it."""
    return sidecar_path(out, ".gym_config.yaml")


def gym_config(rows_path: Any, agent_names: list[str], batches: bool) -> dict[str, Any]:
    """A NeMo-Gym config serving the rows: per agent_ref name, an agent block reading the rows and
    the argument-comparison resources server it routes to (named as NeMo-Gym's configs do:
    `_agent` -> `_resources_server`). With batch actions, parallel-call rewarding is switched on
    in F1 mode (missing and surplus calls cost alike)."""
    from pathlib import Path

    comparator: dict[str, Any] = {"word_count_similarity_threshold": 0.1}
    if batches:
        comparator.update(parallel_tool_call_rewarding=True, parallel_tool_call_reward_mode="f1")
    config: dict[str, Any] = {}
    for name in agent_names:
        server = (name[: -len("_agent")] if name.endswith("_agent") else name) + "_resources_server"
        config[server] = {"resources_servers": {"single_step_tool_use_with_argument_comparison": {
            "entrypoint": "app.py", "domain": "agent", "verified": False,
            "tool_call_comparator_config": dict(comparator),
            "description": "PivotRL pivots exported by pivotrl: one expert action per row."}}}
        config[name] = {"responses_api_agents": {"tool_simulation_agent": {
            "entrypoint": "app.py",
            "resources_server": {"type": "resources_servers", "name": server},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
            "datasets": [{"name": "train", "type": "train", "num_repeats": 1, "license": "TBD",
                          "jsonl_fpath": str(Path(rows_path).resolve())}]}}}
    return config
