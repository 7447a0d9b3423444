"""`hasten env`: what a bug report needs — versions, platform, devices and the configuration in use."""

from __future__ import annotations

import argparse
import os
import platform
import sys


def collect_info(config_file: str | None = None) -> dict:
    import numpy
    import psutil
    import torch

    import hasten

    info = {
        "`hasten` version": hasten.__version__,
        "Platform": platform.platform(),
        "`hasten` bash location": os.path.join(os.path.dirname(sys.executable), "hasten"),
        "Python version": platform.python_version(),
        "Numpy version": numpy.__version__,
        "PyTorch version": torch.__version__,
        "PyTorch accelerator": "CUDA" if torch.cuda.is_available() else "N/A",
        "System RAM": f"{psutil.virtual_memory().total / 1024**3:.2f} GB",
    }
    if torch.cuda.is_available():
        info["GPU type"] = torch.cuda.get_device_name()
        info["GPU count"] = torch.cuda.device_count()
    for key in sorted(os.environ):
        if key.startswith(("HASTEN_", "ACCELERATE_")):
            info[f"env {key}"] = os.environ[key]
    info["Config file"] = _config_summary(config_file)
    return info


def _config_summary(config_file):
    try:
        from ..config import file as config_files
    except ImportError:
        return "Not found"
    find = getattr(config_files, "find_config_file", None)
    try:
        path = find(config_file) if find else (config_file or config_files.default_config_path())
        if not path or not os.path.isfile(path):
            return "Not found"
        return config_files.load_config_file(path)
    except Exception as error:  # noqa: BLE001 - a bug report must still print when the config is broken
        return f"{config_file or 'the default config file'} cannot be read: {error}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hasten env", description="Print environment information for bug reports.")
    parser.add_argument("--config_file", "--config-file", default=None, help="Config file to show.")
    args = parser.parse_args(argv)
    info = collect_info(args.config_file)
    print("\nCopy-and-paste the text below in your GitHub issue\n")
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"- {key}:")
            for k, v in value.items():
                print(f"\t- {k}: {v}")
        else:
            print(f"- {key}: {value}")
    return 0
