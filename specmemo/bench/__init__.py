"""Host tooling that measures the runtimes from outside: benchmarks, the one-run comparison with
the PyTorch reference and peers, plots. Nothing here ships to a device (`specmemo.runtime` does)."""
