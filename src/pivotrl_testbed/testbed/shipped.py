"""The built base, shipped with the package, so a fresh machine skips ~18 minutes of pretraining.

`pivotrl testbed build` makes the base deterministically (seeded init, seeded batch order, the
same thread count), so the weights are a function of the config and of the CPU's float kernels:
the default config pretrained on an AVX-512 AMD EPYC machine gave other weights than the shipped
ones from the same data and tokenizer (byte-identical), and on that machine 30 pretraining steps
under ATEN_CPU_CAPABILITY=avx2 and =avx512 differ (each twice the same). So the shipped copy is
also what gives every machine the same base. The package carries the weights one default build
made (`shipped_base/`: model, tokenizer and that build's `build.json`) and uses them only when
they are what the build would make from this config and data:

- the config's hash (which includes the build's code version) equals the shipped build's, its
  eval sizes aside (`TestbedConfig.weights_digest`: more eval tasks leave the weights as they are), and
- the tokenizer this build just trained on its freshly written data is byte-identical to the
  shipped one (the data and tokenizer steps are cheap, so they always run: any change to the
  worlds, experts or OOD tasks changes the data, hence the tokenizer, hence the shipped base is
  not used).

Otherwise the build continues from the longest prefix of its stages that a shipped base is
(`shipped_s2/` holds the default's first stages, S2), or pretrains from scratch. The same rule lets a build reuse the weights another
build made for its config (`--base-from DIR`, DIR a finished build or a copy of its `base/` and
`build.json`): a candidate base that took hours to pretrain is kept that way across machines,
and a build asked to reuse weights that are not its own stops with the reason. `--no-shipped-base` forces pretraining; CI checks that the
shipped hash is the default config's (tests/test_shipped_base.py). To refresh the weights after a
change, rebuild and copy: `pivotrl testbed build --out runs/testbed --no-shipped-base`, then
`python -m pivotrl_testbed.testbed.shipped runs/testbed`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("shipped_base")
# The base the default's last stage continues from (candidate S2, the default before Z): a build
# whose later stages differ from the default's trains only those, from these weights.
SHIPPED_S2 = Path(__file__).with_name("shipped_s2")
# What a base directory holds that the shipped copy needs (the model, its config, the tokenizer).
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def shipped_info(root: Path = SHIPPED) -> dict[str, Any] | None:
    try:
        return json.loads((root / "build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def weights_hash(info: dict[str, Any], config_type: Any) -> str | None:
    """The weights' hash (`TestbedConfig.weights_digest`; `config_type` is that class) of the
    build a build.json records; None when its config does not give its recorded hash here (another
    build version)."""
    try:
        cfg = config_type.model_validate(info["config"])
    except (KeyError, TypeError, ValueError):
        return None
    return cfg.weights_digest() if cfg.digest() == info.get("config_hash") else None


def mismatch(cfg: Any, tokenizer_dir: Path, root: Path = SHIPPED) -> str | None:
    """Why the base in `root` (a `base/` folder and its build's `build.json`) is not what a build
    of `cfg` (a TestbedConfig) would pretrain, or None when it is."""
    info = shipped_info(root)
    if info is None:
        return f"{root / 'build.json'}: missing or not JSON"
    if weights_hash(info, type(cfg)) != cfg.weights_digest():
        return (f"its build's config hash {info.get('config_hash')} is not this config's "
                f"{cfg.digest()}, eval sizes aside")
    fresh, shipped = tokenizer_dir / "tokenizer.json", root / "base" / "tokenizer.json"
    if not fresh.is_file() or not shipped.is_file() or fresh.read_bytes() != shipped.read_bytes():
        return "its tokenizer differs from the one this build trained on its data (the data changed)"
    return None


def usable(cfg: Any, tokenizer_dir: Path, root: Path = SHIPPED) -> dict[str, Any] | None:
    """The build.json in `root` when its base is exactly what a build of `cfg` would pretrain."""
    return None if mismatch(cfg, tokenizer_dir, root) else shipped_info(root)


def install(out_base: Path, root: Path = SHIPPED) -> None:
    """Copy the shipped base into a build's `base/` folder."""
    out_base.mkdir(parents=True, exist_ok=True)
    for name in BASE_FILES:
        if (root / "base" / name).is_file():
            shutil.copyfile(root / "base" / name, out_base / name)


def ship(build_dir: Path, root: Path = SHIPPED) -> None:
    """Make `build_dir` (a finished default build) the shipped base."""
    info = json.loads((build_dir / "build.json").read_text(encoding="utf-8"))
    if info.get("base_source", "pretrained").startswith(("shipped", "kept")):  # weights it copied
        raise ValueError(f"{build_dir}: its base was not pretrained by this build ({info['base_source']})")
    (root / "base").mkdir(parents=True, exist_ok=True)
    for name in BASE_FILES:
        if (build_dir / "base" / name).is_file():
            shutil.copyfile(build_dir / "base" / name, root / "base" / name)
    (root / "build.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    ship(Path(sys.argv[1]))
    print(f"shipped {sys.argv[1]} -> {SHIPPED}")
