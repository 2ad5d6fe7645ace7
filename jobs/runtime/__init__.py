"""Ray-side training runtime: code that runs inside Ray workers and imports no Django.

- lm:          the built-in workload, a small decoder-only transformer language model (PyTorch)
- corpus:      the generated text corpus it trains on (no download)
- checkpoints: atomic checkpoints (temp dir, fsync, manifest with hashes, rename) and their loader
- faults:      pure fault detection from per-worker progress samples (hang, slow node, bad loss ...)
- goodput:     effective training time (ETTR) accounting and its extrapolation to large clusters
- worker / supervisor: the Ray actors that run a gang and watch it
"""
