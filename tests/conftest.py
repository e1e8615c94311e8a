import os

import torch

# Triton kernels run on CPU tensors through the interpreter; the variable must be set before
# any @triton.jit function is defined, i.e. before mtplab.kernels.triton_* is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
