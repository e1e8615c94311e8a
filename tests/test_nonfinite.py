"""A target whose forward stops being finite raises NonFiniteLogitsError naming the layer,
instead of generating token 0: the step flags the request on the device
(kernels/sampling.py finite_rows, flag_nonfinite: no host sync, the flag travels in the tokens
the host reads anyway), process_result raises, the engine aborts the step's requests and
names the first part of a dense forward whose output is not finite."""
from __future__ import annotations

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.core import NONFINITE_TOKEN
from mtplab.errors import NonFiniteLogitsError
from mtplab.kernels.sampling import finite_rows, flag_nonfinite, nonfinite_token, sample

CASES = {
    "target-only": {},
    "target-only overlap": dict(overlap=True),
    "frozen overlap zero_bubble": dict(draft="frozen_kv_mtp", overlap=True, zero_bubble=True),
    "eagle topk 2": dict(draft="eagle", topk=2, num_draft_tokens=4),
}


@pytest.fixture(scope="module")
def huge_model(tmp_path_factory):
    """random-tiny saved with every weight 1e30: finite, yet the forward overflows (its
    RMSNorms would zero the residual stream: logits all 0, greedy token 0)."""
    d = tmp_path_factory.mktemp("huge")
    eng = Engine(RunConfig(model="random-tiny", device="cpu"))
    with torch.no_grad():
        for p in eng.model.parameters():
            p.fill_(1e30)
    eng.save_target(d)
    return str(d)


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
def test_weights_of_1e30_stop_generate_naming_where_it_overflows(huge_model, kw):
    eng = Engine(RunConfig(model=huge_model, device="cpu", **kw))
    with pytest.raises(NonFiniteLogitsError,
                       match=r"not finite for request 0 at its prefill .* at the output of "
                             r"model\.embed_tokens \(the largest weight is .* = 1e\+30\)"):
        eng.generate([[1, 2, 3]], max_new_tokens=4)
    eng.check_invariants()
    assert eng.idle


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
def test_a_nan_weight_in_decode_names_its_layer_and_frees_the_requests(kw):
    eng = Engine(RunConfig(model="random-tiny", device="cpu", **kw))
    req = eng.add_request([1, 2, 3], max_new_tokens=30)
    other = eng.add_request([4, 5], max_new_tokens=30)
    eng.step()
    eng.step()
    with torch.no_grad():
        eng.model.model.layers[2].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLogitsError,
                       match=r"at its decode step \d+ .* at the output of model\.layers\.2\.mlp "
                             r"\(the largest weight is model\.layers\.2\.mlp\.down_proj\.weight "
                             r"= nan\)"):
        while not eng.idle:
            eng.step()
    assert req.finished_reason == other.finished_reason == "abort"
    eng.check_invariants()


def test_finite_rows_flags_nan_inf_and_an_overflowing_hidden_state():
    logits = torch.zeros(5, 2, 7)                 # 5 requests, 2 nodes each
    hidden = torch.ones(5, 2, 4)
    logits[1, 1, 3] = float("nan")
    logits[2, 0, 0] = float("inf")
    logits[3, 1, 6] = float("-inf")
    hidden[4, 0, 2] = 1e30                        # its square overflows float32
    ok = finite_rows(logits.view(10, 7), hidden.view(10, 4), 5)
    assert ok.tolist() == [True, False, False, False, False]
    tokens = torch.arange(10).view(5, 2)
    flagged = flag_nonfinite(tokens, ok, nonfinite_token(tokens.device))
    assert flagged[0].tolist() == [0, 1] and (flagged[1:] == NONFINITE_TOKEN).all()
    assert tokens[1].tolist() == [2, 3]           # a copy: the device's tokens stay valid


def test_sampling_nan_logits_gives_a_valid_token():
    """The sampled token of a NaN row is still a valid next input (0), never -1."""
    logits = torch.full((2, 5), float("nan"))
    logits[1] = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    tok = sample(logits, torch.ones(2), torch.ones(2), torch.zeros(2, dtype=torch.long),
                 torch.full((2,), 7))
    assert tok[0].item() == 0 and 0 <= tok[1].item() < 5
