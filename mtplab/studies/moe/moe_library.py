"""A well-kept library's MoE kernels beside mtplab's grouped ones: the `library` phase of
question `moe_floor` (moe_floor_runner.py runs it, moe_floor.py renders it).

Both arms compute the routed experts of one MoE layer from its input, with no shared expert:

    mtplab   route_align_triton (router GEMV, softmax, top-k, alignment: one kernel)
             -> moe_ffn_triton (gate/up, down, combine)
    SGLang   F.linear (the router logits) -> fused_topk (sgl_kernel's topk_softmax)
             -> fused_experts (its moe_align_block_size, the Triton fused-MoE GEMMs with
                SiLU-and-mul between them, the top-k sum), out of place

The weights are shared as they lie: w_gate_up [E, 2I, H] (gate rows first), w_down [E, H, I],
the layout SGLang's w1 / w2 take. SGLang is imported only here and only when the phase runs
(`sglang_routed`); where it is missing the phase records why and how to run it
(scripts/sglang_h100.sh moe stages SGLang 0.5.17 on a GPU machine without network).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from mtplab.kernels import fused_moe as fm
from mtplab.kernels import moe_route as mr

FIX = ("run the phase where SGLang is installed: on a GPU machine without network, `bash "
       "scripts/sglang_h100.sh moe` after `receive` + `install` (it runs bench_moe_floor "
       "with the staged SGLang on the path)")

# routed(x, w_router, bias, w_gate_up, w_down, top_k, renormalize) -> the routed output [T, H]
Routed = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor,
                   torch.Tensor, int, bool], torch.Tensor]
# routing(x, w_router, bias, top_k, renormalize) -> (weights [T, k], ids [T, k]): the experts
# an arm's own router picks (the routed output's first half)
Router = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], int, bool],
                  tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Library:
    """One arm of the comparison: its name, version, routed-experts function and its router
    alone (so its expert kernels can be held to the reference on its own routing)."""
    name: str
    version: str
    routed: Routed
    routing: Router


def mtplab_routed(counts: torch.Tensor) -> Library:
    """mtplab's grouped kernels; `counts`: the routing kernel's int32 counters (left zero)."""
    def route(x, w_router, bias, top_k, renormalize):
        return mr.route_align_triton(x, w_router, bias, None, top_k, renormalize,
                                     fm.block_m(x.device.type), counts)

    def routed(x, w_router, bias, w_gate_up, w_down, top_k, renormalize):
        return fm.moe_ffn_triton(x, w_gate_up, w_down,
                                 route(x, w_router, bias, top_k, renormalize), None, None)

    def routing(x, w_router, bias, top_k, renormalize):
        r = route(x, w_router, bias, top_k, renormalize)
        return r.weights, r.ids
    return Library("mtplab", "grouped", routed, routing)


def sglang_routed() -> Library:
    """SGLang's fused MoE; ImportError naming the cause and the fix where it does not import."""
    try:
        import sglang
        from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
        from sglang.srt.layers.moe.topk import StandardTopKOutput, fused_topk
    except Exception as e:           # any failure of SGLang's import chain is the same answer
        raise ImportError(f"SGLang's fused MoE does not import ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); {FIX}") from e
    sglang_context()

    def routing(x, w_router, bias, top_k, renormalize):
        """Router logits in the model dtype, as SGLang serves them (the reference and
        mtplab's router keep them in fp32: a near tie at the k-th expert may go either
        way)."""
        return fused_topk(x, F.linear(x, w_router, bias), top_k, renormalize)

    def routed(x, w_router, bias, w_gate_up, w_down, top_k, renormalize):
        logits = F.linear(x, w_router, bias)
        weights, ids = fused_topk(x, logits, top_k, renormalize)
        E = w_gate_up.shape[0]
        cfg = MoeRunnerConfig(num_experts=E, num_local_experts=E, top_k=top_k, inplace=False)
        return fused_experts(x, w_gate_up, w_down, StandardTopKOutput(weights, ids, logits),
                             cfg)
    return Library("SGLang", getattr(sglang, "__version__", "?"), routed, routing)


def sglang_context(device: str = "cuda") -> None:
    """What SGLang's fused MoE reads of a server outside one, made as SGLang's own kernel
    tests make it; what a process has already is kept:
      - the published server config (runtime_context.get_exec(): its launch-config lookup):
        the defaults for `device` (model path "dummy": no model config is read);
      - the tensor-parallel group (its output buffer): one rank over gloo, no communicator.
    """
    import torch.distributed as dist
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_exec, publish
    from sglang.srt.server_args import ServerArgs
    try:
        get_exec()
    except ValueError:
        publish(ServerArgs(model_path="dummy", device=device), role="test")
    if not dist.is_initialized():
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=1, backend="gloo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference_routing(x: torch.Tensor, w_router: torch.Tensor, bias: Optional[torch.Tensor],
                      top_k: int, renormalize: bool) -> fm.Routing:
    """The reference's routing (route_align_ref: fp32 router logits)."""
    return mr.route_align_ref(x, w_router, bias, None, top_k, renormalize,
                              fm.block_m(x.device.type))


def reference(x: torch.Tensor, w_router: torch.Tensor, bias: Optional[torch.Tensor],
              w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int,
              renormalize: bool) -> torch.Tensor:
    """The torch reference both arms are held to (kernels/fused_moe.py moe_ffn_ref on
    reference_routing)."""
    r = reference_routing(x, w_router, bias, top_k, renormalize)
    return fm.moe_ffn_ref(x, w_gate_up, w_down, r, None, None)


def reference_on(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                 weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The torch reference of the expert FFN on a given routing (an arm's own): its kernels'
    error apart from which experts its router picked."""
    ids = ids.long()
    bm = fm.block_m(x.device.type)
    r = fm.Routing(weights.float(), ids, None, *fm.align(ids, w_gate_up.shape[0], bm))
    return fm.moe_ffn_ref(x, w_gate_up, w_down, r, None, None)


def rerouted(ids: torch.Tensor, ref_ids: torch.Tensor) -> int:
    """Tokens whose set of experts differs between two routings [T, k]."""
    a, b = ids.long().sort(-1).values, ref_ids.long().sort(-1).values
    return int((a != b).any(-1).sum())


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|."""
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
