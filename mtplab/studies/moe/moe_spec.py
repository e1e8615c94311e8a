"""The MoE speculation study's report: what speculation buys on an MoE target against a dense
one, read from the sweep of the grid moe_spec.yaml here (question `moe`).

    mtplab bench --groups mtplab/studies/moe/moe_spec.yaml --dir D [--quick]
    mtplab report moe --from D/moe_spec --command "mtplab bench --groups ..."

The results file is the bench group's (studies/group.py: one row per ok cell, its grid point
model / moe_routing / batch_size, arm, repeat, decode tok/s) with each arm's draft and K and
each model's expert count beside it. Every figure is computed from those rows:

    speedup          an arm's median tok/s / target-only's at the same model, routing and bs,
                     ± the noise (the larger spread of the two, at least 2%), its verdict
    stops paying     per model, routing and arm: the smallest bs from which no larger bs pays
                     (none: it pays up to the largest bs run)
    shape            non-monotonic when the peak speedup lies inside the bs range and beats
                     both the first and the last bs beyond their noise (rises, then falls)
    K=2 vs K=4       per model, routing and draft: K=2's tok/s / K=4's at each bs; the
                     crossover is the smallest bs from which K=2 pays and no larger bs costs
    zipf             per arm and bs on an MoE model: tok/s under zipf / under uniform, and the
                     speedup and stop-paying bs under each
    experts          (the one-process runner's experts pass) distinct experts per MoE layer per
                     verify at each model, routing, K and bs, over uniform routing's
                     expectation E(1 - (1 - k/E)^n) at the verify's n tokens
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd

from .. import QUESTIONS, group
from .. import reports as R

STUDY = "moe_spec"
GRID = Path(__file__).with_name("moe_spec.yaml")
VALUE, BUBBLE = group.VALUE, group.BUBBLE
UNIFORM = "uniform"


def is_spec_grid(grid: dict) -> bool:
    """A grid of this study (a `moe_routing` axis) rather than the `moe` group's."""
    return "moe_routing" in (grid.get("grid") or {})


def results_doc(results: pd.DataFrame, *, sweep_dir: str, command: str, date: str,
                device: Optional[str] = None, note: str = "") -> dict:
    """The group's results doc (studies/group.py) with each arm's draft and K and each model's
    expert count (0: dense)."""
    import yaml

    from ...models.zoo import model_config
    from ..bench import arm_label
    doc = group.results_doc("moe", results, sweep_dir=sweep_dir, command=command, date=date,
                            device=device, note=note)
    grid = yaml.safe_load((Path(sweep_dir) / "grid.yaml").read_text())
    doc["study"] = STUDY
    doc["arm_keys"] = [{"arm": arm_label(a), "draft": a.get("draft", "none"),
                        "k": a.get("num_steps")} for a in grid["arms"]]
    models = sorted({r["point"]["model"] for r in doc["rows"]})
    doc["experts"] = {m: int(model_config(m).num_experts or 0) for m in models}
    return doc


# -- figures ---------------------------------------------------------------------------------
def _frame(doc: dict) -> pd.DataFrame:
    short = {a["arm"]: _name(a) for a in doc["arm_keys"]}
    return pd.DataFrame([{"model": r["point"]["model"],
                          "routing": r["point"].get("moe_routing", UNIFORM),
                          "bs": r["point"]["batch_size"], "arm": short[r["arm"]],
                          VALUE: r[VALUE], BUBBLE: r[BUBBLE]} for r in doc["rows"]])


def _name(a: dict) -> str:
    return "target-only" if a["draft"] == "none" else f"{a['draft']} K={a['k']}"


def _effects(df: pd.DataFrame, col: str, pairs, by) -> pd.DataFrame:
    """arm_effects of `pairs` (values of `col`) at each `by` point, in the grid's order: by
    its leading columns and the pairs' order as they first appear, then bs."""
    from ..effects import NO_VERDICT, arm_effects
    if df.empty or not pairs:
        return pd.DataFrame(columns=[*by, "arm", "baseline", "ratio", "noise", "words"])
    eff = arm_effects(df, col, pairs, by=by, value=VALUE)
    if eff.empty:
        return pd.DataFrame(columns=[*by, "arm", "baseline", "ratio", "noise", "words"])
    eff["words"] = eff["verdict"].map({**group.WORDS, NO_VERDICT: R.ONE_REPEAT})
    keys = [*by[:-1], "arm"]
    rank = {k: {v: i for i, v in enumerate(dict.fromkeys(eff[k]))} for k in keys}
    rank["arm"] = {a: i for i, (a, _) in enumerate(pairs)}
    return eff.sort_values([*keys, by[-1]], key=lambda c: c.map(rank[c.name])
                           if c.name in rank else c, kind="stable").reset_index(drop=True)


def speedups(doc: dict) -> pd.DataFrame:
    """Each drafting arm against target-only at each model, routing and bs."""
    names = [_name(a) for a in doc["arm_keys"]]
    return _effects(_frame(doc), "arm", [(a, names[0]) for a in names[1:]],
                    ["model", "routing", "bs"])


def k_pairs(doc: dict) -> pd.DataFrame:
    """K=2 against K=4 of each draft, at each model, routing and bs."""
    ks: dict[str, dict] = {}
    for a in doc["arm_keys"]:
        ks.setdefault(a["draft"], {})[a["k"]] = _name(a)
    pairs = [(d[2], d[4]) for d in ks.values() if 2 in d and 4 in d]
    return _effects(_frame(doc), "arm", pairs, ["model", "routing", "bs"])


def zipf_pairs(doc: dict) -> pd.DataFrame:
    """Each arm's (`setting`) tok/s under each skewed routing (`arm`) against uniform, per
    model and bs."""
    df = _frame(doc).rename(columns={"arm": "setting"})
    skews = [r for r in dict.fromkeys(df["routing"]) if r != UNIFORM] if len(df) else []
    return _effects(df, "routing", [(z, UNIFORM) for z in skews], ["model", "setting", "bs"])


def stops_paying(curve: pd.DataFrame) -> tuple[Optional[int], str]:
    """(the bs from which no larger bs pays, or None; the sentence) of one arm's speedups
    over bs (sorted)."""
    if (curve["words"] == R.ONE_REPEAT).all():
        return None, "no verdict (one repeat)"
    pays = list(curve["words"] == R.PAYS)
    bs = list(curve["bs"])
    if not any(pays):
        return bs[0], f"pays at no bs ({bs[0]}..{bs[-1]})"
    last = max(i for i, p in enumerate(pays) if p)
    if last == len(bs) - 1:
        return None, f"pays up to bs {bs[-1]}"
    return bs[last + 1], f"stops paying from bs {bs[last + 1]}"


def shape(curve: pd.DataFrame) -> str:
    """Non-monotonic (rises then falls), rises, falls or flat: each step judged against the
    noise of its two ends (no verdict where a side ran once)."""
    r, n, bs = list(curve["ratio"]), list(curve["noise"]), list(curve["bs"])
    if len(r) < 2:
        return "one bs"
    i = max(range(len(r)), key=r.__getitem__)
    if (curve["words"] == R.ONE_REPEAT).any():
        return (f"no verdict (one repeat): {r[0]:.2f}x at bs {bs[0]}, peak {r[i]:.2f}x at bs "
                f"{bs[i]}, {r[-1]:.2f}x at bs {bs[-1]}")
    rise = i > 0 and r[i] / r[0] - 1 > max(n[i], n[0])
    fall = i < len(r) - 1 and r[i] / r[-1] - 1 > max(n[i], n[-1])
    if rise and fall:
        return (f"non-monotonic: rises from {r[0]:.2f}x at bs {bs[0]} to {r[i]:.2f}x at bs "
                f"{bs[i]}, then falls to {r[-1]:.2f}x at bs {bs[-1]}")
    first, last = r[0], r[-1]
    if abs(last / first - 1) <= max(n[0], n[-1]):
        return f"flat within the noise ({first:.2f}x at bs {bs[0]}, {last:.2f}x at bs {bs[-1]})"
    way = "rises" if last > first else "falls"
    return f"{way} with bs: {first:.2f}x at bs {bs[0]} to {last:.2f}x at bs {bs[-1]}"


def crossover(curve: pd.DataFrame) -> str:
    """Where K=2 overtakes K=4 (one draft's K=2 / K=4 ratios over bs, sorted)."""
    words, bs = list(curve["words"]), list(curve["bs"])
    if all(w == R.ONE_REPEAT for w in words):
        return "no verdict (one repeat)"
    for i, w in enumerate(words):
        if w == R.PAYS and R.COSTS not in words[i:]:
            ahead = [b for b, x in zip(bs[:i], words[:i]) if x == R.COSTS]
            return (f"K=2 beats K=4 from bs {bs[i]}" if i else "K=2 beats K=4 at every bs") + \
                (f" (K=4 ahead at bs {', '.join(map(str, ahead))})" if ahead else "")
    ahead = [b for b, x in zip(bs, words) if x == R.COSTS]
    return ("no crossover: K=4 ahead at bs " + ", ".join(map(str, ahead)) if ahead
            else "no crossover: K=2 and K=4 within the noise")


def _measured_bs(doc: dict) -> str:
    """Per model the batch sizes its rows cover (a model run over fewer says so)."""
    by: dict[str, set] = {}
    for r in doc["rows"]:
        by.setdefault(r["point"]["model"], set()).add(r["point"]["batch_size"])
    return "; ".join(f"{m} {', '.join(map(str, sorted(bs)))}" for m, bs in by.items())


def _kind(doc: dict, model: str) -> str:
    e = doc["experts"].get(model, 0)
    return f"{model} (MoE, {e} experts)" if e else f"{model} (dense)"


def experts_frame(doc: dict) -> pd.DataFrame:
    """The experts pass's rows (model, routing, k, bs, experts, uniform, verifies) with
    `vs_uniform` = experts / uniform; empty where none ran."""
    df = pd.DataFrame(doc.get("experts_per_verify") or [],
                      columns=["model", "routing", "k", "bs", "experts", "uniform", "verifies"])
    return df.assign(vs_uniform=df["experts"] / df["uniform"])


def experts_answer(ex: pd.DataFrame) -> list[str]:
    """Per model and routing: the range of experts touched over the uniform expectation."""
    return [f"experts touched per verify on {model}, {routing}: {g['vs_uniform'].min():.2f}"
            f"..{g['vs_uniform'].max():.2f} of uniform routing's expectation"
            for (model, routing), g in ex.groupby(["model", "routing"], sort=False)]


def answer(doc: dict, sp: pd.DataFrame, kp: pd.DataFrame, zp: pd.DataFrame) -> str:
    if sp.empty:
        return "no drafting arm ran beside target-only."
    parts = []
    for (model, routing), g in sp.groupby(["model", "routing"], sort=False):
        arms = []
        for arm, c in g.groupby("arm", sort=False):
            s = stops_paying(c)[1]
            if shape(c).startswith("non-monotonic"):
                top = c.loc[c["ratio"].idxmax()]
                s += f", non-monotonic (peak {top['ratio']:.2f}x at bs {top['bs']})"
            arms.append(f"{arm} {s}")
        parts.append(f"{_kind(doc, model)}, {routing}: " + "; ".join(arms))
    for (model, routing, arm), c in kp.groupby(["model", "routing", "arm"], sort=False):
        parts.append(f"{arm.split(' K=')[0]} on {model}, {routing}: {crossover(c)}")
    for (model, skew), g in zp.groupby(["model", "arm"], sort=False):
        base = g[g["setting"] == "target-only"]
        if len(base):
            lo, hi = base["ratio"].min(), base["ratio"].max()
            parts.append(f"{skew} on {model}: target-only at {lo:.2f}x..{hi:.2f}x of "
                         "uniform's tok/s")
    parts += experts_answer(experts_frame(doc))
    return ". ".join(parts) + "."


# -- report ----------------------------------------------------------------------------------
def _repeats(doc: dict) -> str:
    """What a row's repeat is: a sweep's interleaved repeat, or a runner's window."""
    return "repeats" if doc.get("method") else "interleaved repeats"


def render(doc: dict) -> str:
    sp, kp, zp = speedups(doc), k_pairs(doc), zipf_pairs(doc)
    title = f"{doc['question']}: {QUESTIONS[doc['question']]} (the MoE speculation study)"
    parts = [R.header(doc, title), f"- bench group: `{doc['group']}` (studies/moe/moe_spec.yaml)",
             *([f"- measured by {doc['method']}"] if doc.get("method") else []),
             f"- models: {'; '.join(_kind(doc, m) for m in doc['experts'])}",
             f"- batch sizes measured: {_measured_bs(doc)}", ""]
    parts += R.note_and_answer(doc, answer(doc, sp, kp, zp))
    parts += ["", "## Where speculation stops paying", "",
              "Per model, routing and arm: the smallest batch size from which no larger one "
              "pays (its speedup over target-only beyond the noise), and the curve's shape "
              "over bs (non-monotonic: the peak inside the range beats both ends beyond their "
              "noise).", ""]
    rows = []
    for (model, routing, arm), c in sp.groupby(["model", "routing", "arm"], sort=False):
        rows.append([_kind(doc, model), routing, arm, stops_paying(c)[1], shape(c)])
    parts += [R.md_table(["model", "routing", "arm", "stops paying", "speedup over bs"], rows),
              "", "## Speedup over target-only", "",
              f"Median decode tok/s over the {_repeats(doc)} (arm / target-only at the same "
              "model, routing and bs), the ratio ± the noise (the larger of the two arms' "
              "spread, at least 2%) and its verdict.", ""]
    rows = [[r["model"], r["routing"], str(r["bs"]), r["arm"],
             f"{R.num(r['tok_s'], '.4g')} / {R.num(r['tok_s_base'], '.4g')}",
             R.ratio_text(r["ratio"], r["noise"], r["words"]), f"{r['n']}/{r['n_base']}"]
            for r in sp.to_dict("records")]
    parts += [R.md_table(["model", "routing", "bs", "arm", "tok/s (arm / target-only)",
                          "speedup", "n"], rows)]
    if not kp.empty:
        parts += ["", "## K = 2 against K = 4", "",
                  "Each draft's K=2 arm over its K=4 arm at the same model, routing and bs "
                  "(tok/s ratio ± noise, verdict: pays = K=2 faster).", ""]
        lines = [f"- {arm.split(' K=')[0]} on {model}, {routing}: {crossover(c)}"
                 for (model, routing, arm), c in kp.groupby(["model", "routing", "arm"],
                                                           sort=False)]
        rows = [[r["model"], r["routing"], str(r["bs"]), r["arm"].split(" K=")[0],
                 f"{R.num(r['tok_s'], '.4g')} / {R.num(r['tok_s_base'], '.4g')}",
                 R.ratio_text(r["ratio"], r["noise"], r["words"])]
                for r in kp.to_dict("records")]
        parts += lines + ["", R.md_table(["model", "routing", "bs", "draft",
                                          "tok/s (K=2 / K=4)", "K=2 / K=4"], rows)]
    if not zp.empty:
        parts += ["", "## What zipf routing changes", "",
                  "Each arm's tok/s under the skewed routing over uniform's at the same model "
                  "and bs (± noise, verdict: pays = faster under zipf), and its speedup over "
                  "target-only under each.", ""]
        spd = {(r["model"], r["routing"], r["arm"], r["bs"]): r for r in sp.to_dict("records")}
        rows = []
        for r in zp.to_dict("records"):
            u = spd.get((r["model"], UNIFORM, r["setting"], r["bs"]))
            z = spd.get((r["model"], r["arm"], r["setting"], r["bs"]))
            rows.append([r["model"], r["arm"], r["setting"], str(r["bs"]),
                         R.ratio_text(r["ratio"], r["noise"], r["words"]),
                         "-" if u is None or z is None else
                         f"{u['ratio']:.3f}x -> {z['ratio']:.3f}x"])
        parts += [R.md_table(["model", "routing", "arm", "bs", "tok/s vs uniform",
                              "speedup (uniform -> zipf)"], rows)]
        lines = []
        for (model, arm), c in sp.groupby(["model", "arm"], sort=False):
            by = {rt: stops_paying(g)[1] for rt, g in c.groupby("routing", sort=False)}
            if len(by) > 1:
                lines.append(f"- {arm} on {model}: " + "; ".join(f"{rt}: {s}"
                                                                for rt, s in by.items()))
        parts += ["", *lines] if lines else []
    ex = experts_frame(doc)
    if not ex.empty:
        parts += ["", "## Experts touched per verify", "",
                  "Distinct experts per MoE layer per verify (mean over the verifies at that "
                  "bs; the experts pass: each K's engine again with moe_stats, a few decode "
                  "steps per level, untimed) beside uniform routing's expectation "
                  "E(1 - (1 - k/E)^n) at the verify's n = bs x (K + 1) tokens (K 0: "
                  "target-only).", ""]
        rows = [[r["model"], r["routing"], str(r["k"]), str(r["bs"]), f"{r['experts']:.1f}",
                 f"{r['uniform']:.1f}", f"{r['vs_uniform']:.2f}", str(r["verifies"])]
                for r in ex.to_dict("records")]
        parts += [R.md_table(["model", "routing", "K", "bs", "experts / layer",
                              "uniform expectation", "experts / uniform", "verifies"], rows)]
    for e in doc.get("experts_errors", []):
        parts += [f"- experts pass not measured for {e['model']}, {e['routing']}, {e['arm']}: "
                  f"{e['reason']}"]
    return "\n".join(parts) + "\n"
