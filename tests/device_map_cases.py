"""The device-map cases whose results must equal Accelerate's (expectations in test_device_map.py, made by
scripts/device_map_expectations.py). Integer keys are GPU indices: the computation needs no GPU."""

import torch

NO_SPLIT = {"no_split_module_classes": ["Block"]}

MAP_CASES = [
    # everything fits on one device
    ("tiny_lm", {"max_memory": {"cpu": 10**6}}),
    ("tiny_lm", {"max_memory": {0: 10**6, "cpu": 10**6}}),
    # GPU, then CPU, then disk; the largest layer is kept free on GPU 0 and on the CPU
    ("tiny_lm", {"max_memory": {0: 12000, "cpu": 12000}}),
    ("tiny_lm", {"max_memory": {0: 12000, "cpu": 12000}, **NO_SPLIT}),
    ("tiny_lm", {"max_memory": {0: 9000, 1: 9000, "cpu": 20000}, **NO_SPLIT}),
    ("tiny_lm", {"max_memory": {0: 9000, 1: 9000, "cpu": 20000}}),
    ("tiny_lm", {"max_memory": {0: "9KB", 1: "9KiB", "cpu": "8KB"}, **NO_SPLIT}),
    ("tiny_lm", {"max_memory": {1: 9000, 0: 6000, "cpu": 8000}, **NO_SPLIT}),
    ("tiny_lm", {"max_memory": {0: 9000, 1: 9000, "cpu": 20000}, **NO_SPLIT, "clean_result": False}),
    ("tiny_lm", {"max_memory": {0: 9000, "cpu": 9000}, **NO_SPLIT, "dtype": torch.float16}),
    ("tiny_lm", {"max_memory": {0: 9000, "cpu": 9000}, **NO_SPLIT, "dtype": "float16",
                 "special_dtypes": {"blocks.0.attn.weight": torch.float32}}),
    ("tiny_lm", {"max_memory": {0: 3000, 1: 30000, "cpu": 30000}, **NO_SPLIT}),
    ("tiny_lm", {"max_memory": {0: 3000, 1: 30000, "cpu": 30000}, **NO_SPLIT, "fallback_allocation": True}),
    ("tiny_lm", {"max_memory": {0: 5000, 1: 5000, 2: 5000, 3: 5000, "cpu": 6000}, **NO_SPLIT}),
    ("tiny_lm_untied", {"max_memory": {0: 9000, 1: 9000, "cpu": 20000}, **NO_SPLIT}),
    ("tiny_lm_untied", {"max_memory": {0: 12000, "cpu": 8000}}),
    ("with_buffers", {"max_memory": {0: 200, "cpu": 200}}),
    ("with_buffers", {"max_memory": {0: 150, 1: 150, "cpu": 150}}),
    ("with_buffers", {"max_memory": {0: 100, "cpu": 100}, "offload_buffers": True}),
    ("with_buffers", {"max_memory": {"cpu": 150}}),
    ("nested", {"max_memory": {0: 20000, 1: 20000, "cpu": 20000}}),
    ("nested", {"max_memory": {0: 40000, "cpu": 10000}}),
    ("nested", {"max_memory": {0: 10000, 1: 10000, "cpu": 60000}, "no_split_module_classes": ["Sequential"]}),
    ("three_linears", {"max_memory": {0: 50000, "cpu": 50000}}),
    ("three_linears", {"max_memory": {0: 90000, 1: 90000}}),
    ("three_linears", {"max_memory": {0: 90000, 1: 90000, "cpu": 90000, "disk": 10**6}}),
    ("three_linears", {"max_memory": {"cpu": 100000}}),
]

BALANCED_CASES = [
    ("three_linears", {"max_memory": {0: 900000, 1: 900000, "cpu": 10**7}}),
    ("three_linears", {"max_memory": {0: 900000, 1: 900000, 2: 900000, "cpu": 10**7}, "low_zero": True}),
    ("tiny_lm", {"max_memory": {0: 10**6, 1: 10**6, "cpu": 10**7}, **NO_SPLIT}),
    ("tiny_lm", {"max_memory": {0: 10**6, 1: 10**6, 2: 10**6, "cpu": 10**7}, **NO_SPLIT, "low_zero": True}),
    ("tiny_lm", {"max_memory": {0: 10**6, 1: 10**6, "cpu": 10**7}, "dtype": torch.float16}),
    ("nested", {"max_memory": {0: 10000, 1: 30000, 2: 30000, "cpu": 10**7}}),
    ("tiny_lm", {"max_memory": {0: 10**6, "cpu": 10**7}, **NO_SPLIT}),
    ("tiny_lm", {"max_memory": {"cpu": 10**7}}),
]
