#!/bin/sh
# Train every paper recipe on every backend (numpy: the first validation of the smaller ones) and write
# the histories to examples/papers/results/, then print the README's tables from them.
# One thread per framework: on a shared or small machine, intra-op thread pools contend
# for the cores and make these small models many times slower (measured 55 ms vs 2.3 ms
# per LeNet step in torch on a loaded 2-core machine).
set -e
cd "$(dirname "$0")"
export OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
out=results
for backend in torch jax tensorflow; do
    python lenet5.py --backend "$backend" --out "$out"
    python resnet.py --backend "$backend" --out "$out"
    python char_transformer.py --backend "$backend" --out "$out"
    python nanogpt.py --backend "$backend" --out "$out"
    python vae.py --backend "$backend" --out "$out"
    python word_language_model.py --backend "$backend" --out "$out"
done
python lenet5.py --backend numpy --stop-after 1 --out "$out"
python resnet.py --backend numpy --stop-after 1 --out "$out"
python nanogpt.py --backend numpy --stop-after 1 --out "$out"
python vae.py --backend numpy --stop-after 1 --out "$out"
for backend in torch tensorflow numpy; do  # JAX trains in float32 only
    python vae.py --backend "$backend" --dtype float64 --out "$out"
done
python tables.py "$out"
