"""luce's GPU check as a package; tools/gpu_check.py is its command (docs/gpu.md, "Running the check").

- device.py        paths, environment switches, build, C test hooks, plain generation, device measurements
- matmul.py        every weight type's matmul vs gguf.quants and the int8-activation oracle
- kernel_checks.py attention, argmax / top-k and DeltaNet kernels vs float64 / numpy
- models.py        fixture models on the device vs the CPU backend; compute-sanitizer memcheck
- graphs.py        step graphs and launch switches vs eager launches, bit for bit
- sampling.py      seeded sampling and rejection sampling vs their numpy oracles
- drafters.py      reference drafters device vs CPU; speculative == plain parity
- bench.py         synthetic 27B benches, the matmul kernel bench, per-op profiles
- spec_bench.py    the DFlash 2 step bench and its profile; the reference pair's speculative bench
- report.py        gpu_report.json / gpu_report.md
- cli.py           arguments, build-then-rerun, the stages in order
"""
