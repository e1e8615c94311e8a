import os

import pytest
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


def _row_invariant_interpreter_dot() -> None:
    """The interpreter's tl.dot is one numpy matmul per tile. Some CPUs' BLAS (OpenBLAS's
    AMD Zen sgemm) give a row's bits that depend on its place in the tile, which no GPU
    kernel does: the batch-invariance tests (deterministic mode) check the kernels' fixed
    tiles, not the host BLAS. Where numpy's matmul is not row invariant, the dot becomes an
    einsum, whose sum over K runs in one order for every element."""
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    perm = rng.permutation(64)
    if np.array_equal(a[perm] @ b, (a @ b)[perm]) and np.array_equal(a[:1] @ b, (a @ b)[:1]):
        return
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        assert a.dtype.primitive_bitwidth != 8 and b.dtype.primitive_bitwidth != 8, \
            "fp8 dot: the row-invariant stand-in covers 16/32-bit operands"
        out = np.einsum("...ik,...kj->...ij", a.data.astype(d.data.dtype),
                        b.data.astype(d.data.dtype), optimize=False)
        return interpreter.TensorHandle(out + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot


if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    else:
        _row_invariant_interpreter_dot()


@pytest.fixture(scope="session", autouse=True)
def _watch_engines():
    """Every Engine any test builds is watched (tests/helpers.py EngineWatch)."""
    from mtplab.engine import Engine
    tests.helpers.ENGINES.install(Engine)
    yield
    tests.helpers.ENGINES.uninstall()


@pytest.fixture(autouse=True)
def engine_invariants(request, _watch_engines):
    """check_invariants() at the end of every test, for each Engine it built and left open
    (one it closed was checked at close). A test that breaks an engine on purpose is marked
    `breaks_engine` and is not checked."""
    yield
    if request.node.get_closest_marker("breaks_engine"):
        tests.helpers.ENGINES.forget()
    else:
        tests.helpers.ENGINES.verify()
