"""Print the README's tables from the histories the recipes wrote.

    python examples/papers/tables.py examples/papers/results

Per recipe and backend: validations run (one per epoch, or per ``val_every_n_steps`` updates
for the recipes that validate by steps), the final validation loss and accuracy, wall time.
Then, per recipe, how far the backends' validation losses are apart: the relative spread
``(max - min) / min`` over the backends at each validation, for the first and the worst.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    runs: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        runs.setdefault(result["recipe"], []).append(result)
    print("| recipe | backend | validations | val_loss | val_accuracy | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for recipe, results in runs.items():
        for result in results:
            last = result["history"][-1]
            accuracy = f"{last['val_accuracy']:.4f}" if "val_accuracy" in last else "-"
            print(
                f"| {recipe} | {result['backend']} | {len(result['history'])} | "
                f"{last['val_loss']:.4f} | {accuracy} | {result['seconds']} |"
            )
    print()
    print("| recipe | backends | first spread of val_loss | worst spread (validation) |")
    print("| --- | --- | --- | --- |")
    for recipe, results in runs.items():
        epochs = max(len(r["history"]) for r in results)
        spreads = []
        for epoch in range(epochs):
            losses = [r["history"][epoch]["val_loss"] for r in results if len(r["history"]) > epoch]
            if len(losses) > 1:
                spreads.append(((max(losses) - min(losses)) / min(losses), epoch + 1))
        if not spreads:
            continue
        worst = max(spreads)
        names = ", ".join(r["backend"] for r in results)
        print(f"| {recipe} | {names} | {spreads[0][0]:.1e} | {worst[0]:.1e} ({worst[1]}) |")


if __name__ == "__main__":
    main()
