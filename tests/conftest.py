import os

import torch

# Triton kernels run on CPU tensors through the interpreter; the variable must be set before
# any @triton.jit function is defined, i.e. before mtplab.kernels.triton_* is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The CI machine has 2 cores shared with other processes; one intra-op thread keeps the
# small-tensor test workloads fast and free of oversubscription stalls.
torch.set_num_threads(1)
