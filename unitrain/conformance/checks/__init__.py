"""The built-in checks, one module per family (checkpoints in two); importing this package
registers them all."""

from unitrain.conformance.checks import (  # noqa: F401  (imported to register their checks)
    accumulation,
    callbacks,
    checkpoints,
    checkpoints_strict,
    data_parallel,
    determinism,
    devices,
    dropout,
    early_stopping,
    eval_mode,
    fused,
    handoff,
    layers,
    losses,
    mixed_precision,
    model_state,
    ops,
    optimizers,
    resume,
    schedules,
    sharded,
)
