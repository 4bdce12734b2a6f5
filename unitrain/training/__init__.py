"""The Trainer and what it keeps of a run.

:mod:`unitrain.training.trainer` holds :class:`~unitrain.Trainer` and :mod:`.config` its
:class:`~unitrain.TrainerConfig`; the private modules beside it are its parts: the update loop
(``_fit_loop``), validation and prediction (``_evaluation``, ``_inference``), the running loss
(``_running``), what a checkpoint holds of a run (``_run_state``), the run folder's lock and lineage
(``_lock``, ``_lock_file``, ``_lineage``) and preemption (``_preemption``).
:mod:`unitrain.training.rng` seeds and saves the global generators. Import the Trainer from
:mod:`unitrain`.
"""
