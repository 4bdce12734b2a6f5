"""unitrain's benchmark suite: unitrain against hand-written loops, Keras ``fit`` and Lightning.

Run ``python benchmarks/run.py --quick`` (see ``benchmarks/README.md``). Importing this package
imports no framework: each method runs in a child process of its own, which pins its threads
before it imports one.
"""
