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
