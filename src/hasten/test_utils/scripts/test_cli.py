"""The smallest script `hasten launch` can run anywhere: it reports the accelerators this process sees.

Lives at Accelerate's `test_utils/scripts/test_cli.py` path, which its CLI tests launch.
"""

import torch


def main():
    if torch.cuda.is_available():
        kind, count = "GPU", torch.cuda.device_count()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        kind, count = "XPU", torch.xpu.device_count()
    else:
        kind, count = "GPU", 0  # Accelerate's wording on a CPU-only machine: "0 GPUs"
    print(f"Successfully ran on {count} {kind}s")


if __name__ == "__main__":
    main()
