#!/usr/bin/env bash
# The wheels the GPU machine lacks, for its Python 3.12 / torch 2.11 (CUDA 13), downloaded into .whl/ (ignored by
# git) so that they travel with the working tree (64 MiB in all, the repository included) and
# `bash scripts/gpu_check.sh` installs them there first, with no index (the machine reaches none).
#   bash scripts/gpu_wheels.sh        # run here, where pip reaches PyPI (PYTHON picks the interpreter: python3)
# What travels: torchao (fp8 cases), DeepSpeed as a pure-Python wheel built here from its sdist with no ops
# compiled (DS_BUILD_OPS=0; hasten's DeepSpeed cases use torch's AdamW, so no op is built there either) and the
# pure-Python needs the machine's image lacks (hjson, pydantic and its pieces). What cannot travel:
# bitsandbytes (CUDA builds of ~60-120 MiB: past the limit with the repository) and transformer_engine (hundreds of
# MiB, built per CUDA version); their cases skip with that reason.
# Works on a bare python3 (no `wheel` package, setuptools 65, no torch): DeepSpeed is built in pip's isolated build
# environment, which brings its own setuptools and wheel; without torch its setup.py compiles nothing. The script
# ends by checking that every wheel the suite needs is in .whl/, once (scripts/gpu_plan.py --check-wheels), and
# fails loudly otherwise: a missing wheel is an error here, not a skip on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
PIP="${PIP:-$PYTHON -m pip}"
DEST=.whl
TORCHAO="${TORCHAO_VERSION:-0.18.0}"      # torchao 0.18 loads its kernels on torch >= 2.11
DEEPSPEED="${DEEPSPEED_VERSION:-0.19.8}"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" --no-deps -d "$DEST")
rm -rf "$DEST" && mkdir -p "$DEST"
$PIP download -q "${TARGET[@]}" "torchao==$TORCHAO"
# The image has einops, msgpack, ninja, numpy, packaging, psutil, py-cpuinfo, nvidia-ml-py, tqdm and
# typing-extensions (docs/gpu_validation.md); these it lacks:
$PIP download -q "${TARGET[@]}" hjson "pydantic>=2,<3" "pydantic-core" annotated-types typing-inspection
# pydantic pins the exact pydantic-core it was built with: fetch that one, not the newest.
core=$(unzip -p "$DEST"/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([^ ;]*\).*/\1/p')
rm -f "$DEST"/pydantic_core-*.whl
$PIP download -q "${TARGET[@]}" "pydantic-core==$core"
# DeepSpeed publishes an sdist only: build the pure-Python wheel here, no ops compiled, in pip's isolated build
# environment (`--no-build-isolation` needed the `wheel` package, which a bare python3 lacks: "invalid command
# 'bdist_wheel'").
$PIP download -q --no-deps --no-binary :all: -d "$DEST/sdist" "deepspeed==$DEEPSPEED"
DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1 $PIP wheel -q --no-deps -w "$DEST" "$DEST"/sdist/deepspeed-*.tar.gz
rm -rf "$DEST/sdist"
du -ch "$DEST"/*.whl | sort -h
$PYTHON scripts/gpu_plan.py --check-wheels
