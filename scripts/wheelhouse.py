"""The wheels a GPU machine without a package index needs to run pivotrl (scripts/gpu_check.sh).

The GPU image ships torch (CUDA), transformers, accelerate, peft, tokenizers, numpy, pyarrow, pytest,
typer and rich, but not trl, datasets or pydantic. This script computes what is missing — the
dependency closure of what pivotrl imports, minus the closure of what the image already has — from
the metadata of the packages installed HERE (so the versions shipped are the ones this checkout is
tested with), then downloads one wheel per package for CPython 3.12 on x86-64 Linux and checks
that the folder fits the 64 MiB a device run can carry.

    python scripts/wheelhouse.py plan                 # what would be downloaded, no network
    python scripts/wheelhouse.py download --dest .wheelhouse
    python scripts/wheelhouse.py check --dest .wheelhouse

`plan` and `check` are offline (tests/test_gpu_kit.py runs them on fake folders).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

MIB = 1024 * 1024
LIMIT_BYTES = 64 * MIB  # what one device run carries with the working tree

# What the GPU image has installed (its own builds and versions; our pins do not apply there), as
# its documentation listed it on 2026-11-17. Anything it has is used as it is, never shadowed by a
# wheel built against other versions (pandas against another numpy, say), except SHIP_ALWAYS.
IMAGE_ROOTS = tuple("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
# Known absent from the image even where an image package's metadata HERE depends on them (typer
# here requires pydantic; the image's typer evidently does not): the image closure stops at them.
NOT_ON_IMAGE = ("trl", "datasets", "pydantic", "vllm")
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def project_roots(pyproject: Path = PYPROJECT) -> tuple[str, ...]:
    """What pivotrl needs: its dependencies and its `dev` extra (the test suite), read from
    pyproject.toml, so a dependency added there is shipped without editing this script."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [*project["dependencies"], *project.get("optional-dependencies", {}).get("dev", [])]
    return tuple(Requirement(r).name for r in reqs)
# Shipped even though the image has them: datasets pins them tightly (huggingface-hub >= 1.31,
# fsspec <= 2026.9) and the image's copies are of unknown version; these are the ones tested here.
SHIP_ALWAYS = ("huggingface-hub", "fsspec", "pyyaml")

# The target interpreter: markers are evaluated for it, not for the Python running this script.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython",
              "platform_release": "", "platform_version": "", "implementation_version": "3.12.0"}
# pip matches a manylinux_2_N tag only for an N it is given; the image's glibc runs all of these.
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")


def normalise(name: str) -> str:
    """PEP 503 name: `Pydantic_Core` and `pydantic-core` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def local_requires(name: str) -> list[str] | None:
    """Requirement strings of an installed distribution; None if it is not installed here."""
    try:
        return metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return None


def local_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def direct_deps(requires: Iterable[str], extras: Iterable[str] = ()) -> list[Requirement]:
    """The requirements that apply on the target for the given extras."""
    out = []
    for line in requires:
        req = Requirement(line)
        if req.marker is None:
            out.append(req)
            continue
        for extra in ("", *extras):
            if req.marker.evaluate({**TARGET_ENV, "extra": extra}):
                out.append(req)
                break
    return out


RequiresFn = Callable[[str], "list[str] | None"]


def closure(roots: Iterable[str], requires: RequiresFn = local_requires,
            stop: Iterable[str] = ()) -> dict[str, Requirement | None]:
    """Every project reachable from `roots` through hard requirements (and requested extras),
    never entering `stop`. Maps normalised name -> the first requirement that pulled it in (None
    for a root). Projects not installed here are kept, with no further edges."""
    stop = {normalise(s) for s in stop}
    seen: dict[str, Requirement | None] = {}
    extras: dict[str, set[str]] = {}
    todo: list[tuple[str, Requirement | None]] = [(r, None) for r in roots]
    while todo:
        name, why = todo.pop()
        key = normalise(name)
        new_extras = set(why.extras) if why is not None else set()
        if key in stop or (key in seen and new_extras <= extras[key]):
            continue
        seen.setdefault(key, why)
        extras[key] = extras.get(key, set()) | new_extras
        reqs = requires(name)
        for req in direct_deps(reqs or [], extras[key]):
            todo.append((req.name, req))
    return seen


def plan(requires: RequiresFn = local_requires,
         version: Callable[[str], str | None] = local_version, *,
         image_roots: Iterable[str] = IMAGE_ROOTS, not_on_image: Iterable[str] = NOT_ON_IMAGE,
         needed_roots: Iterable[str] | None = None,
         ship_always: Iterable[str] = SHIP_ALWAYS) -> list[str]:
    """Requirement strings to download: `name==version` when installed here, else the
    requirement that pulled the project in (its version range)."""
    ship_always = tuple(ship_always)
    needed_roots = project_roots() if needed_roots is None else needed_roots
    image = set(closure(image_roots, requires, stop=not_on_image))
    needed = closure((*needed_roots, *ship_always), requires)
    ship = {normalise(s) for s in ship_always}
    out = []
    for key, why in sorted(needed.items()):
        if key in image and key not in ship:
            continue
        ver = version(key)
        if ver is not None:
            out.append(f"{key}=={ver}")
        else:
            spec = str(why.specifier) if why is not None else ""
            out.append(f"{key}{spec}")
    return out


def wheel_project(filename: str) -> str:
    """`pydantic_core-2.46.4-cp312-...whl` -> `pydantic-core`."""
    return normalise(filename.split("-", 1)[0])


def check(dest: Path, wanted: Iterable[str], limit: int = LIMIT_BYTES, tree_bytes: int = 0) -> list[str]:
    """Problems with a wheelhouse: over the size limit together with the `tree_bytes` of the
    working tree that travels with it, a wanted project without a wheel, a file that is not a
    wheel (an sdist would need a build, and the GPU machine has no network). Empty: fine."""
    problems = []
    files = sorted(p for p in dest.iterdir() if p.is_file()) if dest.is_dir() else []
    total = sum(p.stat().st_size for p in files)
    if total + tree_bytes > limit:
        problems.append(f"{dest}: {total / MIB:.1f} MiB + working tree {tree_bytes / MIB:.1f} MiB "
                        f"> limit {limit / MIB:.0f} MiB")
    have = {wheel_project(p.name) for p in files if p.suffix == ".whl"}
    for req in wanted:
        name = normalise(Requirement(req).name)
        if name not in have:
            problems.append(f"{dest}: no wheel for {req}")
    problems += [f"{p}: not a wheel" for p in files if p.suffix != ".whl"]
    return problems


def tree_bytes(repo: Path = PYPROJECT.parent) -> int:
    """Bytes of the files git tracks or would add (untracked, not ignored): what travels with the
    wheelhouse to a device machine. 0 outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=repo, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    paths = (repo / name for name in out.decode(errors="replace").split("\0") if name)
    return sum(p.stat().st_size for p in paths if p.is_file())


def size_mib(dest: Path) -> float:
    return sum(p.stat().st_size for p in dest.iterdir() if p.is_file()) / MIB


def download(dest: Path, wanted: list[str], python: str = "3.12") -> None:
    """One `pip download` for all: binary wheels only, for the target interpreter, no deps (the
    closure is ours; pip would otherwise pull torch back in through accelerate)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp",
           "--abi", f"cp{python.replace('.', '')}",
           *[arg for p in PLATFORMS for arg in ("--platform", p)], "--dest", str(dest),
           "--disable-pip-version-check", "--quiet", *wanted]
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["plan", "download", "check"])
    parser.add_argument("--dest", type=Path, default=Path(".wheelhouse"))
    parser.add_argument("--limit-mib", type=float, default=LIMIT_BYTES / MIB)
    parser.add_argument("--python-version", default="3.12", help="Target interpreter (the GPU "
                        "image's is 3.12; another one only to rehearse the kit on a CPU machine).")
    args = parser.parse_args(argv)
    wanted = plan()
    if args.action == "plan":
        print("\n".join(wanted))
        return 0
    if args.action == "download":
        download(args.dest, wanted, args.python_version)
    tree = tree_bytes()
    problems = check(args.dest, wanted, int(args.limit_mib * MIB), tree)
    for p in problems:
        print(f"wheelhouse: {p}", file=sys.stderr)
    if args.dest.is_dir():
        n = len(list(args.dest.glob("*.whl")))
        print(f"wheelhouse {args.dest}: {n} wheels, {size_mib(args.dest):.1f} MiB; with the working "
              f"tree {size_mib(args.dest) + tree / MIB:.1f} MiB (limit {args.limit_mib:.0f} MiB)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
