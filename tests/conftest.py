"""Shared fixtures. Torch runs on one thread: with 2 cores shared, 2-thread torch slowed 10-19×."""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"

import json  # noqa: E402
import random  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def sample_texts(n: int = 200, seed: int = 0) -> list[str]:
    """A small built-in corpus: tool-call-like chat text, shell commands, arithmetic, ASCII."""
    rng = random.Random(seed)
    names = ["get_order", "cancel_order", "find_customer", "list_products", "refund", "ls", "cat"]
    out = []
    for i in range(n):
        name = rng.choice(names)
        args = {"order_id": f"O-{rng.randint(1, 999)}", "reason": rng.choice(["late", "broken"])}
        out.append(
            "<|im_start|>user\nPlease help with order %s<|im_end|>\n<|im_start|>assistant\n"
            "<tool_call>\n%s\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
            '{"status": "ok", "total": %d}\n</tool_response><|im_end|>\n'
            % (args["order_id"], json.dumps({"name": name, "arguments": args}), rng.randint(1, 500)))
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        out.append(f"What is {a} + {b}? {a + b}. Reverse 'abc{i}': '{str(i)[::-1]}cba'. "
                   f"cat notes/file{i}.txt | grep -c todo > out.txt")
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tokenizer (trained on `sample_texts`) + a random tiny Llama, saved in HF format."""
    from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, build_tokenizer, save_tiny

    tokenizer = build_tokenizer(sample_texts(), vocab_size=512)
    model = build_model(tokenizer, TinyModelConfig(max_positions=2048))
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def quick_testbed(tmp_path_factory):
    """(folder, build record) of one quick testbed build whose base this build pretrained (the
    quick config is not the shipped one's); shared because each build costs seconds. Read-only."""
    from pivotrl_testbed.testbed.build import TestbedConfig, build_testbed

    out = tmp_path_factory.mktemp("quick_testbed")
    return out, build_testbed(out, TestbedConfig().quick(), use_shipped_base=False)


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests need CUDA: skipped, with the reason, on machines without it."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu marker)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """A worker process a failed test left behind must not keep the run from exiting (Python
    joins its multiprocessing children at exit, and a hung one would hang the whole run)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)
