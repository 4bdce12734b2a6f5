"""Pictures of runs: a run's loss, metrics and learning rate, or several runs side by side.

Both read the ``metrics.jsonl`` that ``unitrain train`` writes (one JSON object per epoch)
and draw with matplotlib (``pip install 'unitrain[plot]'``), without a display.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unitrain._errors import ConfigError, MissingFrameworkError

__all__ = ["plot_runs", "read_metrics"]

#: Logged values that are not curves worth drawing.
_NOT_CURVES = ("epoch", "step", "seconds", "skipped_steps", "run_id")


def read_metrics(run: str | Path) -> list[dict[str, Any]]:
    """The epoch rows of a run folder's ``metrics.jsonl`` (or of that file itself)."""
    path = Path(run)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"{path}: no metrics file; pass a folder written by 'unitrain train --out DIR'"
        )
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number}: not a JSON line ({error})") from None
    if not rows:
        raise ConfigError(f"{path}: no epochs logged yet")
    return rows


def _panels(runs: Mapping[str, list[dict[str, Any]]]) -> list[tuple[str, list[str]]]:
    """One panel for the losses, one per other metric, one for the LR; keys in log order."""
    keys: list[str] = []
    for rows in runs.values():
        for row in rows:
            keys += [k for k in row if k not in keys and k not in _NOT_CURVES]
    losses = [k for k in keys if k.endswith("loss")]
    others = [k for k in keys if k not in losses and k != "lr"]
    panels = [("loss", losses)] if losses else []
    panels += [(key, [key]) for key in others]
    if "lr" in keys:
        panels.append(("learning rate", ["lr"]))
    return panels


def epoch_positions(rows: list[dict[str, Any]]) -> list[float]:
    """Each row's place on the epoch axis: an epoch's row at its number, a validation by
    steps (``val_every_n_steps``) at the share of its epoch's updates done by then.

    An epoch ends at the step of its last row; rows without int ``epoch`` and ``step``
    are placed at their ``epoch``.

    Examples:
        >>> steps = [(1, 3), (1, 4), (2, 6), (2, 8)]  # validated at 3 and 6, epochs of 4
        >>> epoch_positions([{"epoch": epoch, "step": step} for epoch, step in steps])
        [0.75, 1.0, 1.5, 2.0]
    """
    if not all(type(r.get("epoch")) is int and type(r.get("step")) is int for r in rows):
        return [r["epoch"] for r in rows]
    ends = {row["epoch"]: row["step"] for row in rows}  # the last row of each epoch wins
    places = []
    for row in rows:
        start = ends.get(row["epoch"] - 1, 0)
        length = ends[row["epoch"]] - start
        share = (row["step"] - start) / length if length > 0 else 1.0
        places.append(row["epoch"] - 1 + share)
    return places


def plot_runs(runs: Mapping[str, str | Path], out: str | Path, *, title: str = "") -> Path:
    """Draw runs' curves by epoch into the PNG ``out``; returns its path.

    Args:
        runs: label -> run folder (or metrics file); one line per run in every panel.
        out: where to write the PNG.
        title: written above the panels.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed, none opened
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise MissingFrameworkError("plots need matplotlib: pip install 'unitrain[plot]'") from None
    rows = {label: read_metrics(run) for label, run in runs.items()}
    panels = _panels(rows)
    columns = min(3, len(panels))
    lines = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(4.5 * columns, 3.4 * lines))
    flat = list(getattr(axes, "flat", [axes]))
    for axis, (name, keys) in zip(flat, panels):
        for label, epochs in rows.items():
            places = epoch_positions(epochs)
            for key in keys:
                points = [(x, r[key]) for x, r in zip(places, epochs) if r.get(key) is not None]
                if points:
                    tag = key if len(rows) == 1 else f"{label} {key}" if len(keys) > 1 else label
                    axis.plot(*zip(*points), marker="o", markersize=3, label=tag)
        axis.set_title(name)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        if name == "learning rate":
            axis.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        axis.legend(fontsize="small")
    for axis in flat[len(panels) :]:
        axis.set_visible(False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
