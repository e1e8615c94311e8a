"""kernels_per_layer of a profiled sweep cell on CUDA (graphs on, the column `mtplab bench`
shows) against bench_kernels' two-depth difference on an eager forward of the same model."""
import math

import pytest
import torch

from mtplab import Engine, RunConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp"])
@pytest.mark.parametrize("fused", [True, False])
def test_kernels_per_layer_of_a_graphed_cell_is_the_two_depth_difference(tmp_path, fused,
                                                                         draft):
    from mtplab.studies.decode_floor.kernel_figures import layer_counts
    from mtplab.sweep.grid import Workload
    from mtplab.sweep.measure import measure

    kw = dict(model="random-tiny", device="cuda", fused=fused, max_running_requests=1)
    row = measure(RunConfig(draft=draft, cuda_graphs=True, profile=True, profile_wait=1,
                            profile_warmup=1, profile_active=3, trace_dir=str(tmp_path),
                            run_name="cell", **kw),
                  Workload(batch_size=1, prompt_len_tokens=16, output_len_tokens=8,
                           warmup_output_len_tokens=2))
    per, outside, (block, reps), _ = layer_counts(Engine(RunConfig(**kw)))[fused]
    assert per == block and reps in (3, 4) and outside > 0
    k = row["kernels_per_layer"]
    assert not math.isnan(k) and row["kernels_per_step"] > 4 * k
    if draft == "none":      # one token per forward, as the eager forward: the same kernels
        assert k == per, (k, per)
    # a spec verify runs the tree's tokens (M > 1): cuBLAS may pick other GEMM kernels (e.g.
    # without split-K), so only a sane figure is asserted there
