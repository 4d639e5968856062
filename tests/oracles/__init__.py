"""Wrappers around reference drafter implementations that nobody on this project wrote.

    zlab.py  z-lab's `dflash` package (0.1.0): DFlashDraftModel (backbone), DFlash2DraftModel
             (grouped dynamic causal convs + CandidateSelector).
    nemo.py  NVIDIA NeMo Automodel (0.7.0): Qwen3DFlash2DraftModel (+ CandidateSelector.walk),
             Qwen3DSparkModel (vanilla Markov head + confidence head).

Only construction, weight loading and calling live here; the assertions live in
tests/test_drafter_parity_*.py. Every wrapper runs in fp32 on CPU under torch.no_grad.
What each oracle covers and why it may or may not be used: docs/oracles.md.
"""
