"""The run plan: every decision about how a run is distributed, made once before anything is built.

`make_run_plan` (rules.py) turns what `Accelerator(...)` (or a hand-built `AcceleratorState(...)`) was given, the
resolved settings and the detected processes into one frozen `RunPlan`. The state, the backend registry, the
precision policy and `GradientState` read the plan and decide nothing again; `hasten config explain --plan` prints
the plan the same function makes from the launch settings alone. The package stands below `state.py`, so the state
can build a plan too, and imports only settings (config/), the layout (parallelism_config.py) and core.
"""

from .rules import Accumulation, Cluster, Precision, RunPlan, make_run_plan, megatron_layout

__all__ = ["Accumulation", "Cluster", "Precision", "RunPlan", "make_run_plan", "megatron_layout"]
