"""Print the device maps Accelerate computes for the cases in tests/big_model/test_device_map.py (`CASES`), as the
literal expectations that test holds. Needs `pip install accelerate==1.15.0` (the `bench` extra); run it
again when cases are added:

    python scripts/device_map_expectations.py
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from device_map_cases import BALANCED_CASES, MAP_CASES  # noqa: E402
from big_model_zoo import MODELS  # noqa: E402


def main() -> int:
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    warnings.simplefilter("ignore")
    print("EXPECTED_MAPS = [")
    for model_name, kwargs in MAP_CASES:
        result = infer_auto_device_map(MODELS[model_name](), **kwargs)
        print(f"    {dict(result)!r},")
    print("]\nEXPECTED_BALANCED = [")
    for model_name, kwargs in BALANCED_CASES:
        print(f"    {get_balanced_memory(MODELS[model_name](), **kwargs)!r},")
    print("]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
