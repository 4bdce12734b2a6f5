"""The built-in checks, one module per family; importing this package registers them all."""

from unitrain.conformance.checks import (  # noqa: F401  (imported to register their checks)
    accumulation,
    callbacks,
    checkpoints,
    data_parallel,
    determinism,
    devices,
    dropout,
    early_stopping,
    eval_mode,
    fused,
    handoff,
    layers,
    mixed_precision,
    model_state,
    optimizers,
    resume,
    schedules,
)
