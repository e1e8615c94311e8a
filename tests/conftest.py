import os

import torch

# Triton kernels run on CPU tensors through the interpreter; the variable must be set before
# any @triton.jit function is defined, i.e. before mtplab.kernels.triton_* is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A snapshot of triton.language before any kernel is interpreted (tests/helpers.py
# restore_triton_language, used by the ahead-of-time compile tests).
import tests.helpers  # noqa: E402,F401

# The CI machine has 2 cores shared with other processes; one intra-op thread keeps the
# small-tensor test workloads fast and free of oversubscription stalls.
torch.set_num_threads(1)
