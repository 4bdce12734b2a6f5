"""The built-in checks, one module per family; importing this package registers them all."""

from unitrain.conformance.checks import (  # noqa: F401  (imported to register their checks)
    accumulation,
    callbacks,
    checkpoints,
    determinism,
    devices,
    early_stopping,
    eval_mode,
    fused,
    mixed_precision,
    optimizers,
    resume,
    schedules,
)
