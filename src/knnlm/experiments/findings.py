"""The findings report (target 'findings'): each claim of the claims table (claims.yaml: every statement of Xu et al.
(2023), and of the follow-ups its sections name, that the run can test) as rows of the paper's numbers, ours with
their 95 % CI paired over documents (knnlm.statistics.intervals) and a verdict computed from the CI by the same rules
for every row; the rules that replace or qualify a verdict (claims.yaml 'rules') counted in a table of their own; a
summary figure of the verdicts by part of the paper. How a verdict is reached, row by row: docs/verdicts.md (the
legend every report links)."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pandas as pd

from ..job import Job
from ..io import atomic_path, read_checked_json, read_json, write_json
from ..statistics.captions import ci_caption, comparison_rows, contrast_row
from .common import lm_training_label
from ..statistics.verdicts import band_verdict, paper_verdict, within_verdict
from ..datastore.stores import TRAINING_SUBSET_LABEL
from ..report.figures import findings_summary_figure
from ..scoring.settings import FAISS_FAISS, FAISS_REAL, REAL_REAL, TUNED, store_vs_store

# what every findings report says of its legend, instead of pasting it (the verdicts and how each is reached)
LEGEND = ("Each row: a claim, the paper's numbers, ours with its 95 % CI paired over documents, the units it rests on and "
          "the verdict computed from the CI. What each verdict means and how it is reached: docs/verdicts.md "
          "(the legend); the claims and the rules applied to them: src/knnlm/experiments/claims.yaml.")
CLAIMS_FILE = Path(__file__).with_name("claims.yaml")  # the claims table: what each claim is and how it is tested


def _claim(section, claim, source, comparison, paper=None, sign=None, within=None, share=None, regex=False,
           kind="paper", ref=None, about=None, equivalent=None, reported=False, paper_text=None, unit=None,
           count_zero=False, verdicts=None, size=None, regime=None, id=None, shown=None, choose=None, also=None):
    """One entry of the claims table (claims.yaml, whose header defines each field) as the engine reads it: the
    fields with their defaults, `paper` as (a, b) or {b: (a, b)}, `share` as a number, a margin ('equivalent',
    'within') as a number or as {'share', 'of'} (derived on valid, _with_margin), and 'pattern', the regular
    expression of the comparison rows it is tested on."""
    return {"id": id, "section": section, "claim": claim, "source": source, "paper": paper, "sign": sign,
            "within": within, "share": share, "size": size, "about": about, "equivalent": equivalent,
            "reported": reported, "kind": kind, "ref": ref,
            "paper_text": paper_text, "unit": unit, "count_zero": count_zero, "verdicts": verdicts,
            # read at τ = 1 where a side has a τ-tuned twin (_tau1_sides), whatever the claim's kind; not a claim
            # about τ itself (a 'tau*' claim, a reported number, a count or a checked property)
            "tau1": not (kind == "tau*" or reported or count_zero or verdicts),
            "comparison": comparison, "pattern": comparison if regex else re.escape(comparison),
            "also": also, "regime": regime, "shown": shown or (_readable(comparison) if regex else comparison), "choose": choose}


def _readable(pattern: str) -> str:
    """A comparison's regular expression as a findings row names it when the run has no matching row: any name '…',
    any number 'N', alternatives joined by 'or' (no '|' inside a Markdown table)."""
    for rx, to in ((r"\\S\+", "…"), (r"\\d\+", "N"), (r"\.\+", "…")):
        pattern = re.sub(rx, to, pattern)
    return re.sub(r"\\(.)", r"\1", pattern).replace("|", " or ")


def load_claims(path: str | Path = CLAIMS_FILE) -> list[dict]:
    """The claims of the claims table at `path` (YAML: 'margins', the shares of a reference's gain that the derived
    margins use, by name, with their source; 'paper_numbers', tables of the paper's perplexities by name; and
    'claims', the entries), each as _claim gives it. Raises ValueError naming the file and the entry for an unknown
    field, a missing one, a duplicate id, an unknown table of paper numbers or margin."""
    path = Path(path)
    doc = claims_document(path)
    tables = doc.get("paper_numbers") or {}
    shares = {k: v["share"] for k, v in (doc.get("margins") or {}).items()}
    bands = {k: v["share"] for k, v in (doc.get("bands") or {}).items()}
    axes, by_source = doc.get("regime") or {}, doc.get("regime_of_source") or {}
    out, seen = [], set()
    for n, entry in enumerate(doc["claims"]):
        where = f"{path}: claim {entry.get('id', n)!r}"
        e = dict(entry)
        if e.get("id") in seen or not e.get("id"):
            raise ValueError(f"{where}: expected a unique 'id', found {e.get('id')!r}")
        seen.add(e["id"])
        if isinstance(e.get("paper"), str):
            if e["paper"] not in tables:
                raise ValueError(f"{where}: 'paper' names no table of 'paper_numbers' ({sorted(tables)})")
            e["paper"] = {b: tuple(ab) for b, ab in tables[e["paper"]].items()}
        elif isinstance(e.get("paper"), list):
            e["paper"] = tuple(e["paper"])
        if isinstance(e.get("share"), dict):
            g, o = e["share"]["gain"], e["share"]["of"]
            e["share"] = (g[0] - g[1]) / (o[0] - o[1])
        if isinstance(e.get("unit"), list):
            e["unit"] = tuple(e["unit"])
        for key in ("equivalent", "within"):  # a derived margin's share, by its name in 'margins'
            if isinstance(e.get(key), dict) and isinstance(e[key].get("share"), str):
                if e[key]["share"] not in shares:
                    raise ValueError(f"{where}: '{key}.share' names no entry of 'margins' ({sorted(shares)})")
                e[key] = {**e[key], "share": shares[e[key]["share"]]}
        if e.get("about") is not None:  # a stated value's band, by its name in 'bands'
            if e["about"] not in bands:
                raise ValueError(f"{where}: 'about' names no entry of 'bands' ({sorted(bands)})")
            if e.get("share") is None and e.get("size") is None:
                raise ValueError(f"{where}: 'about' is the band of a stated 'share' or 'size'; the claim has neither")
            e["about"] = {"share": bands[e["about"]], "name": e["about"]}
        e.setdefault("regime", by_source.get(e.get("source"), []))
        unknown = sorted(set(e["regime"]) - set(axes))
        if unknown:
            raise ValueError(f"{where}: 'regime' names axes {unknown} that 'regime' does not define ({sorted(axes)})")
        try:
            out.append(_claim(**e))
        except TypeError as err:
            raise ValueError(f"{where}: {err}") from None
    return out


def load_regime(path: str | Path = CLAIMS_FILE) -> dict:
    """The regime axes of the claims table at `path` ('regime': {axis: {'name', 'paper', 'factor', 'source'}}): what a
    claim's outcome may depend on where this run is far from the paper's, and how far (a factor) still counts as the
    paper's regime."""
    return claims_document(Path(path)).get("regime") or {}


def claims_document(path: Path) -> dict:
    """The parsed claims table at `path`, checked against its schema (src/knnlm/schemas/claims.schema.yaml; load_claims,
    load_rules, load_regime and the regime map's load_effects read its parts; a text already checked in this process
    is not parsed again). Raises ValueError naming the file, each key at fault, what was expected and what was found."""
    return _parse_claims(path.read_text(encoding="utf-8"), str(path))


@functools.lru_cache(maxsize=4)
def _parse_claims(text: str, path: str) -> dict:
    import yaml

    from ..io import errors_text, schema_errors

    doc = yaml.safe_load(text)
    _, errors = schema_errors(doc, "claims")
    if errors:
        raise ValueError(f"{path}: not a valid claims table: {errors_text(errors)}")
    return doc


KIND = {"paper": "the paper's", "ours": "ours (beyond the paper)", "tau*": "the paper's, each side at its τ*",
        "follow-up": "the follow-up's (the paper its section names)"}
TAU1_OFF = "reported (τ = 1 is off τ* here: the verdict is at τ*)"
# A row whose premise fails in this run (an LM that did not memorise as the paper's did): no verdict, counted apart
PREMISE_ABSENT = "not tested (premise absent)"
SUBSET = TRAINING_SUBSET_LABEL  # the kNN-LM on the alternatives' training rows
CLAIMS = load_claims()
REGIME = load_regime()


def load_rules(path: str | Path = CLAIMS_FILE) -> dict[str, dict]:
    """The rules of the claims table at `path` ('rules': {name: {'effect', 'does', 'basis'}}) that replace or qualify
    a findings row's verdict (_tested names them). Raises ValueError naming the file and the rule for a missing field
    or an effect other than 'replaces' / 'qualifies' (the claims table's schema)."""
    return claims_document(Path(path)).get("rules") or {}


RULES = load_rules()


def rules_table(rows: list[dict], rules: dict[str, dict] = RULES) -> pd.DataFrame:
    """One row per rule of `rules` (every one, touched or not): how many findings rows it touched and the verdicts
    those rows would have had without it, by direction (a reproduction or a contradiction of the paper, or neither:
    withheld where the rule replaces the verdict, qualified where it qualifies it). rows: findings rows with their '_rules' [(rule, verdict without it)] (_tested). Raises ValueError for
    a rule a row names that `rules` lacks (the claims table must describe every rule the engine applies)."""
    counts = {name: {"reproduced": 0, "contradicted": 0, "other": 0} for name in rules}
    for row in rows:
        for name, would in row.get("_rules") or []:
            if name not in counts:
                raise ValueError(f"{CLAIMS_FILE}: the findings engine applied rule {name!r}, which its 'rules' lacks")
            kind = would.split(" (")[0]
            counts[name][kind if kind in ("reproduced", "contradicted") else "other"] += 1
    return pd.DataFrame([{"rule": name, "effect": r["effect"], "rows": sum(counts[name].values()),
                          "would be reproduced": counts[name]["reproduced"],
                          "would be contradicted": counts[name]["contradicted"],
                          "would be neither": counts[name]["other"], "what it does": r["does"], "basis": r["basis"]}
                         for name, r in rules.items()])


def _pick(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows of Table 3 comparisons for att/L2, else the first key type present (with L2 when present)."""
    key = "att" if "att" in set(df["h_ds"]) else keys[0]
    sub = df[df["h_ds"] == key]
    metric = "L2" if "L2" in set(sub["⊗"]) else sorted(set(sub["⊗"]))[0]
    return sub[sub["⊗"] == metric]


def _every_token(settings: dict | None) -> bool:
    """Whether a settings JSON (rule settings) was scored on every test token or a block sample of them (an
    '-alltokens' store, config 'retrieval.table3_fraction'; on valid, every token or its tuning sample)."""
    return settings is not None and settings.get("scope", "retrieval scope") != "retrieval scope"


def _every_label(settings: dict | None) -> str:
    """', all tokens' (or ', a 40 % block sample of all tokens') for a store scored on every token (_every_token),
    else ''."""
    return f", {settings['scope']}" if _every_token(settings) else ""


def _sources(job: Job, s: dict | None) -> dict[str, tuple[pd.DataFrame, str]]:
    """{source: (comparisons with columns split, comparison, relative difference, CI low, CI high, verdict), label};
    `s`: the settings JSON of input 'small_store', or None without one."""
    t3 = pd.read_csv(job.path("table3"))
    t3 = _pick(t3, sorted(set(t3["h_ds"])))
    t = read_checked_json(job.path("table3_settings"), "settings") if job.input.get("table3_settings") else None
    every = _every_label(t) if str(job.path("table3")).endswith("table3_all_comparisons.csv") else ""
    probe = _probe_label(t, job.cfg["knn"]["k"]) if t is not None else ""
    out = {"table1": (pd.read_csv(job.path("table1")), ""), "parametric": (pd.read_csv(job.path("parametric")), ""),
           "table3": (t3, f"{t3['h_ds'].iloc[0]}/{t3['⊗'].iloc[0]}{probe}{every}" if len(t3) else "")}
    for name in ("which_words", "hypotheses", "interpolated_loss", "ensembling", "overfitting",
                 "soft_labels", "token_gains", "lambda_by_quality", "adaptive_retrieval", "k_sweep",
                 "leakage", "ngram", "retomaton", "pruning", "generation"):  # App. D, E, follow-ups
        if job.input.get(name):
            out[name] = (pd.read_csv(job.path(name)), "")  # rows with an 'on' column say what they rest on
    if job.input.get("table4"):  # App. A: the kNN-LM of each base LM, and their gains compared
        out["table4"] = (pd.read_csv(job.path("table4")), "")
    if t is not None:  # the Table 3 store's settings: the gain of tuning τ, setting vs setting; the two gaps (Sec. 5.1)
        out["tuning"] = (tuning_contrasts(t, job.cfg["stats"]), out["table3"][1])
        out["gaps"] = (gap_contrasts(t, job.cfg["stats"], "table3"), out["table3"][1])
    if s is not None:
        from ..scoring.settings import tau_edges
        from ..statistics.captions import flag_edges

        rows = flag_edges([r for split, c in s["ci"].items() for r in comparison_rows(c, split=split)], tau_edges(s))
        label = f"{s['key_type']}/{s['metric'].upper()}, {s['ratio']:.0%} store{_probe_label(s, job.cfg['knn']['k'])}"
        every = _every_label(s)
        out["small_store"] = (pd.DataFrame(rows), label + every)
        out["small_tuning"] = (tuning_contrasts(s, job.cfg["stats"]), label + every)
        out["small_gaps"] = (gap_contrasts(s, job.cfg["stats"], "small_store"), label + every)
        if job.input.get("full_store"):  # on the retrieval scope, the full store's ('size_store')
            small = read_checked_json(job.path("size_store"), "settings") if job.input.get("size_store") else s
            full = read_checked_json(job.path("full_store"), "settings")
            out["size"] = (size_comparisons(small, full, job.cfg["stats"]), f"{label} vs full")
            out["size_gaps"] = (store_contrasts(small, full, job.cfg["stats"], f"{s['ratio']:.0%} store"),
                                f"{label} vs full")
        if job.input.get("large_store") and job.input.get("full_store"):  # the largest subset (Figure 2's 90 %)
            large = read_checked_json(job.path("large_store"), "settings")
            out["large_size"] = (size_comparisons(large, full, job.cfg["stats"], label=f"{large['ratio']:.0%} store"),
                                 f"{large['key_type']}/{large['metric'].upper()}, {large['ratio']:.0%} store"
                                 f"{_probe_label(large, job.cfg['knn']['k'])} vs full")
    if job.input.get("size_curve"):  # every store of Figure 2's grid: the curve against its straight line
        curve = sorted((read_checked_json(p, "settings") for p in job.paths("size_curve")),
                       key=lambda c: float(c["ratio"]))
        ratios = ", ".join(f"{float(c['ratio']):.0%}" for c in curve)
        out["size_curve"] = (curve_linearity(curve, job.cfg["stats"]),
                             f"{curve[0]['key_type']}/{curve[0]['metric'].upper()}, stores of {ratios}"
                             f"{_probe_label(curve[-1], job.cfg['knn']['k'])}")
    out["tau_gains"] = (tau_gains(out), "")  # Finding 3: the settings of the stores, the gain of tuning τ
    if job.input.get("pca_store"):  # He et al. 2021's PCA-reduced keys vs the full keys (Sec. 5.2 cites it)
        p, full = (read_checked_json(job.path(n), "settings") for n in ("pca_store", "pca_full"))
        rows = size_comparisons(p, full, job.cfg["stats"], label=p["store"])
        dims = f"{p['dim']} of {full.get('dim', '?')} dims"
        out["pca"] = (rows, f"{p['key_type']}/{p['metric'].upper()}, {dims}{_probe_label(p, job.cfg['knn']['k'])}")
    return out


def load_sources(path: str | Path = CLAIMS_FILE) -> dict[str, dict]:
    """What differs per findings source, as data ('sources' of the claims table at `path`: {source: {'store',
    'tau_star', 'format', 'target', 'equal_rows'}}, defined in its header); a source it does not list has none."""
    return claims_document(Path(path)).get("sources") or {}


SOURCES = load_sources()


def source_has(source: str, field: str, value=True) -> bool:
    """Whether findings source `source` has `field` = `value` in SOURCES (the claims table's 'sources')."""
    return SOURCES.get(source, {}).get(field) == value


SMALL_SOURCES = tuple(s for s in SOURCES if source_has(s, "store", "small"))  # the paper's 5 % store, ours its ratio
# the sources whose rows are differences of two relative differences (shown with two decimals)
CONTRAST_SOURCES = tuple(s for s in SOURCES if source_has(s, "format", "contrast"))
FOLLOWUP_SOURCES = tuple(s for s in SOURCES if source_has(s, "target", "extras"))  # config 'extras.in_all'
PAPER_SCAN = 1170  # the paper's FAISS search scans ~1,170·k keys per query: 32 of 4,096 lists of 153M keys, k = 1,024


def _probe_label(s: dict, k: int) -> str:
    """', nprobe n of L lists (x %), m·k keys scanned per query (the paper: ~1,170·k), recall@k r' of a settings
    JSON's test search (knnlm.search.index.search), '' when it does not say: the regime of the row's FAISS mask, how
    approximate it is beside the paper's (the probe sweep shows the comparison at other strengths)."""
    scan = s.get("scan", {}).get("test", {})
    if not scan.get("nprobe") or not scan.get("lists"):
        return ""
    out = f", nprobe {scan['nprobe']} of {scan['lists']} lists ({100 * scan['nprobe'] / scan['lists']:.3g} %)"
    if scan.get("keys_scanned_per_query"):
        out += (f", {scan['keys_scanned_per_query'] / k:,.1f}·k keys scanned per query (the paper: ~{PAPER_SCAN:,}·k)")
    if isinstance(s.get("recall"), dict) and s["recall"].get("test") is not None:
        out += f", recall@k {s['recall']['test']:.2f}"
    return out


def tuning_contrasts(s: dict, stats: dict) -> pd.DataFrame:
    """Rows (split, comparison 'τ*/τ=1 of A minus τ*/τ=1 of B', relative difference, CI low, CI high, verdict,
    documents): how much less tuning τ helps setting A than setting B, as the difference of the two ratios
    ppl(τ*) / ppl(τ = 1), paired over the documents of settings JSON `s` (Sec. 5.2, Figure 5: tuning τ matters
    for a real score, less for the FAISS score). Positive: tuning helps A less."""
    scheme = s.get("documents_scheme", {}).get("scheme", "")
    rows = []
    for split, d in s["doc_nll"].items():
        for a, b in ((FAISS_FAISS, FAISS_REAL), (FAISS_FAISS, REAL_REAL)):
            names = [a, a + TUNED, b, b + TUNED]
            if all(n in d for n in names):
                rows.append(contrast_row([d[n] for n in names], s["doc_words"][split],
                                      lambda p: p[..., 1] / p[..., 0] - p[..., 3] / p[..., 2], stats, scheme, split,
                                      f"τ*/τ=1 of {a} minus τ*/τ=1 of {b}"))
    return pd.DataFrame(rows)


def gap_contrasts(s: dict, stats: dict, source: str) -> pd.DataFrame:
    """Rows (the columns of tuning_contrasts, and 'τ settings', 'τ source' for _tau1_off) of Sec. 5.1's comparison of
    the two approximations on one store (settings JSON `s`, whose own rows are findings source `source`): the score
    gap (FAISS mask: real score vs FAISS score, ppl_FR / ppl_FF − 1) minus the mask gap (real score: real mask vs
    FAISS mask, ppl_RR / ppl_FR − 1), paired over the documents, at τ = 1 and with each setting at its τ*. Positive:
    the approximate score gains more over the real one than the approximate mask over the real one."""
    scheme = s.get("documents_scheme", {}).get("scheme", "")
    rows = []
    for split, d in s["doc_nll"].items():
        for t in ("", TUNED):
            names = [FAISS_FAISS + t, FAISS_REAL + t, REAL_REAL + t]
            if all(n in d for n in names):
                rows.append(contrast_row(
                    [d[n] for n in names], s["doc_words"][split],
                    lambda p: (p[..., 1] / p[..., 0] - 1) - (p[..., 2] / p[..., 1] - 1), stats, scheme, split,
                    f"score gap ({names[1]} vs {names[0]}) minus mask gap ({names[2]} vs {names[1]})",
                    **{"τ settings": "" if t else "; ".join(names), "τ source": "" if t else source}))
    return pd.DataFrame(rows)


def store_contrasts(small: dict, full: dict, stats: dict, label: str = "small store") -> pd.DataFrame:
    """Rows (the columns of tuning_contrasts) of Sec. 5.2's "a small datastore benefits more from this regularization,
    both through the FAISS mask and the FAISS score (at optimal temperature settings)": the gain of each approximation
    at τ* on the store of settings JSON `small` minus the same gain on the store of `full` (the mask's: ppl_RR* /
    ppl_FR* − 1; the score's: ppl_FR* / ppl_FF* − 1), paired over the documents both were scored on (ArtifactError,
    knnlm.scoring.settings.check_same_scope, when they differ). Positive: the small store gains more."""
    from ..scoring.settings import check_same_scope

    scheme = small.get("documents_scheme", {}).get("scheme", "")
    rows = []
    for split, d in small["doc_nll"].items():
        check_same_scope(small, full, split)
        f = full["doc_nll"][split]
        for what, (a, b) in (("mask", (REAL_REAL + TUNED, FAISS_REAL + TUNED)),
                             ("score", (FAISS_REAL + TUNED, FAISS_FAISS + TUNED))):
            if all(n in d and n in f for n in (a, b)):
                rows.append(contrast_row([d[a], d[b], f[a], f[b]], small["doc_words"][split],
                                      lambda p: (p[..., 0] / p[..., 1] - 1) - (p[..., 2] / p[..., 3] - 1), stats,
                                      scheme, split, f"{what} gain ({a} vs {b}): {label} minus full"))
    return pd.DataFrame(rows)


def tau_gains(sources: dict) -> pd.DataFrame:
    """The rows 'X τ* vs X' (the gain of tuning τ for setting X) of the stores' sources ('table3', 'small_store'),
    each renamed 'X τ* vs X [store]' with its store's label in column 'on': the settings among which Finding 3's
    "in some settings the gap … can be as high as 3.7 %" picks (a claim with 'choose', on valid)."""
    out = []
    for src, where in (("table3", "full store"), ("small_store", "small store")):
        df, label = sources.get(src, (None, ""))
        if df is None or df.empty:
            continue
        rows = df[df["comparison"].str.fullmatch(r"(\S+) τ\* vs \1")].copy()
        rows["comparison"] = rows["comparison"] + f" [{where}]"
        rows["on"] = label
        out.append(rows)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def size_comparisons(small: dict, full: dict, stats: dict, label: str = "small store") -> pd.DataFrame:
    """Rows (split, comparison '<setting> (<label> vs full)', relative difference, CI low, CI high, verdict): each
    mask/score setting (and its tuned-τ twin) on another store (a subset: Sec. 4, Figure 2; a PCA store) against the
    full store, paired over the same documents from the two settings JSONs' per-document NLL
    (retrieval.store_vs_store, which raises ArtifactError when the two were scored on different documents)."""
    diffs = {split: {f"{name} ({label} vs full)": store_vs_store(small, full, split, name, stats)
                     for name in names if name != "base" and name in full["doc_nll"][split]}
             for split, names in small["doc_nll"].items()}
    return pd.DataFrame([r for split, d in diffs.items() for r in comparison_rows({"diff": d}, split=split)])


def curve_linearity(stores: list[dict], stats: dict) -> pd.DataFrame:
    """Rows (the columns of size_comparisons) of Sec. 4.2's "the final perplexity decreases almost linearly with
    more percentage of the original datastore" (Figure 2), from the settings JSONs `stores` of the nested subsets and
    the full store (ratio 1), any order, scored on the same documents: for each store of ratio r strictly between the
    smallest (r0) and the full one, each setting's perplexity against the straight line between the smallest store's
    and the full store's at r, ppl_r / ((1 − w) ppl_r0 + w ppl_full) − 1 with w = (r − r0) / (1 − r0), comparison
    '<setting> (<r> store vs the line from <r0> to full)' (0: on the line; below 0: the curve falls faster early),
    and the whole curve's fall '<setting> (<r0> store vs full)' (ppl_r0 / ppl_full − 1), each paired over the
    documents (knnlm.statistics.captions.contrast_row). ArtifactError (check_same_scope) when two stores were scored
    on different documents or tokens; ValueError without a full store. Fewer than 3 stores: no rows."""
    from ..scoring.settings import check_same_scope
    from ..statistics.captions import contrast_row

    stores = sorted(stores, key=lambda s: float(s["ratio"]))
    if len(stores) < 3:
        return pd.DataFrame()
    if float(stores[-1]["ratio"]) != 1.0:
        raise ValueError(f"the size curve needs the full store (ratio 1); its largest is {stores[-1]['ratio']}")
    first, full = stores[0], stores[-1]
    r0 = float(first["ratio"])
    scheme = first.get("documents_scheme", {}).get("scheme", "")
    rows = []
    for split in first["doc_nll"]:
        for s in stores[1:]:
            check_same_scope(first, s, split)
        words = first["doc_words"][split]
        names = [n for n in first["doc_nll"][split] if n != "base" and all(n in s["doc_nll"][split] for s in stores)]
        for name in names:
            ends = [first["doc_nll"][split][name], full["doc_nll"][split][name]]
            rows.append(contrast_row(ends, words, lambda p: p[..., 0] / p[..., 1] - 1, stats, scheme, split,
                                     f"{name} ({r0:.0%} store vs full)"))
            for s in stores[1:-1]:
                w = (float(s["ratio"]) - r0) / (1 - r0)
                rows.append(contrast_row([ends[0], s["doc_nll"][split][name], ends[1]], words,
                                         lambda p, w=w: p[..., 1] / ((1 - w) * p[..., 0] + w * p[..., 2]) - 1,
                                         stats, scheme, split,
                                         f"{name} ({float(s['ratio']):.0%} store vs the line from {r0:.0%} to full)"))
    return pd.DataFrame(rows)


def scope_power(job: Job, s: dict | None, target: float = 0.01) -> str:
    """What the retrieval scope can decide: the median 95 % CI half-width of Table 3's test comparisons, and the
    scope (documents, tokens) that would bring it under `target` if it shrinks as 1/sqrt(documents); with
    `s`, the small store's settings JSON scored on every token, its test documents and tokens."""
    t3, cmp = pd.read_csv(job.path("table3_table")), pd.read_csv(job.path("table3"))
    test = t3[t3["split"] == "test"]
    cmp = cmp[cmp["split"] == "test"]
    if test.empty or cmp.empty:
        return "Scope: Table 3 has no test rows."
    docs, tokens = int(test["documents"].iloc[0]), int(test["tokens"].iloc[0])
    half = float(((cmp["CI high"] - cmp["CI low"]) / 2).median())
    need = docs * (half / target) ** 2
    verdict = (f"already under {100 * target:.0f} %" if half < target else
               f"about {need:,.0f} documents (~{need * tokens / docs:,.0f} tokens per split) would bring it under "
               f"{100 * target:.0f} %, if it shrinks as 1/sqrt(documents)")
    text = (f"Scope of Table 3 and the store claims: {docs} test documents, {tokens:,} tokens. The median 95 % CI "
            f"half-width of Table 3's test comparisons is {100 * half:.2f} % of perplexity; {verdict}.")
    if _every_token(s):
        text += (f" The {s['ratio']:.0%} store's claims use {s['scope'].replace('all tokens', 'every test token')} "
                 f"({len(s['doc_ids']['test'])} documents, {s['scope_tokens']['test']:,} tokens).")
    return text


def _band_text(c: dict) -> str:
    """The band of claim `c`'s stated share or size as its paper column shows it: '±X pp' once derived for a row
    (_with_margin), else the rule it is derived by."""
    if isinstance(c["about"], dict):
        return f"± {c['about']['share']:.0%} of it"
    return f"±{100 * c['about']:.2g} pp"


def _paper(c: dict, b: str | None) -> tuple[str, int]:
    """(the paper's number as text, the sign of its a / b − 1) for claim `c` tested on a row whose b is `b`."""
    a_b = c["paper"].get(b) if isinstance(c["paper"], dict) else c["paper"]
    derived = bool(c.get("margin_from")) or isinstance(c["within"], dict) or isinstance(c["equivalent"], dict)
    text = (f"{a_b[0]:.3f} vs {a_b[1]:.3f} ({100 * (a_b[0] / a_b[1] - 1):+.1f} %)" if a_b
            else c["paper_text"] if derived and c["paper_text"]
            else f"within {100 * c['within']:.2g} %" if c["within"] and not derived
            else f"{100 * c['share']:.1f} % (about: {_band_text(c)})" if c["share"]
            else f"{100 * c['size']:+.1f} % (about: {_band_text(c)})" if c["size"] is not None
            else c["paper_text"] if c["paper_text"] else "τ = 1 near τ*" if c["reported"] else "direction only")
    if a_b and c["equivalent"] and not derived:
        text += f"; about equal: within ±{100 * c['equivalent']:.2g} %"
    sign = c["sign"] if c["sign"] is not None else (-1 if a_b and a_b[0] < a_b[1] else 1 if a_b else 0)
    return text, sign


def _alternative_looks_worse(c: dict, r: pd.Series) -> bool:
    """Whether a parametric comparison row shows the trained alternative worse than what it is compared with: worse
    than the kNN-LM ('kNN-LM X vs ALT' lower), than the base LM ('ALT vs base' higher), or recovering less of the
    gain than the claimed share (CI below it)."""
    if c["share"] is not None:
        return r["CI high"] < c["share"]
    if r["comparison"].startswith("kNN-LM "):
        return r["verdict"] == "lower"
    return r["verdict"] == "higher"


def _fewer_rows(r: pd.Series) -> bool:
    """Whether a parametric comparison row's variant saw fewer training rows than what it is compared with (a
    kNN-LM's datastore, or a W_ds trained on more rows): more data could change a verdict against it."""
    try:
        return int(r["train rows"]) < int(r["reference rows"])
    except (KeyError, TypeError, ValueError):  # not a parametric row, or compared with the base LM ('-')
        return False


def _equal_rows_twin(r: pd.Series, df: pd.DataFrame) -> bool:
    """Whether parametric comparison row r, a variant trained on fewer rows than the all-rows kNN-LM it is compared
    with, has a twin at equal rows in `df`: the same variant against the kNN-LM on its own training rows ('kNN-LM X on
    the subset', knnlm.datastore.stores.TRAINING_SUBSET). The twin's claims then carry the verdict; r stays in the
    parametric comparisons table."""
    if not _fewer_rows(r) or not str(r["comparison"]).startswith(("kNN-LM ", "share of the gain: ")):
        return False
    variant = re.sub(r"^share of the gain: (.+) of kNN-LM .+$|^kNN-LM \S+(?: τ\*)? vs (.+)$",
                     lambda m: m.group(1) or m.group(2), r["comparison"])
    same = df[(df["split"] == r["split"]) & df["comparison"].str.contains(SUBSET + r"(?: τ\*)? vs |of kNN-LM \S+" + SUBSET)]
    return bool(same["comparison"].map(lambda c: c.endswith(" vs " + variant) or
                                       c.startswith(f"share of the gain: {variant} of ")).any())


def _with_margin(c: dict, r: pd.Series, df: pd.DataFrame) -> dict:
    """Claim `c` with its margin for comparison row r where the claims table derives it from an effect (an
    'equivalent' or 'within' given as {'share': s, 'of': '<comparison>' or a list of them, the first the table has;
    '{a}' and '{b}' stand for r's two sides, '{g1}', '{g2}' … for the groups of the claim's pattern in r):
    s × |relative difference| of comparison 'of' in the same table on valid, where the choice is made, and never
    narrower than what the run resolves, the half-width of r's own 95 % CI on valid. The claim's text states the
    margin it got and where it came from ('margin_from'). Without the 'of' row (or r's valid row) that part is 0.
    The band of a stated share or size ('about' {'share': s}, from 'bands') is derived alike: s × |the stated value|,
    never narrower than the half-width of r's own CI on valid."""
    valid = df[df["split"] == "valid"] if "split" in df else df.iloc[0:0]

    def first(name):
        rows = valid[valid["comparison"] == name] if len(valid) else valid
        return rows.iloc[0] if len(rows) else None

    own = first(r["comparison"])  # what the run resolves: the half-width of r's own CI on valid
    resolution = (float(own["CI high"]) - float(own["CI low"])) / 2 if own is not None else 0.0
    if isinstance(c.get("about"), dict):
        stated = c["share"] if c["share"] is not None else c["size"]
        scaled = c["about"]["share"] * abs(stated)
        band = max(scaled, resolution)
        how = (f"{c['about']['share']:.0%} of the stated value" if scaled >= resolution else
               f"the half-width of its CI on valid, wider than {c['about']['share']:.0%} of the stated value")
        c = {**c, "about": band, "band_from": how,
             "claim": f"{c['claim']}: here ±{100 * band:.2g} pp ({how})"}
    for key in ("equivalent", "within"):
        spec = c.get(key)
        if not isinstance(spec, dict):
            continue
        a, _, b = str(r["comparison"]).partition(" vs ")
        m = re.fullmatch(c["pattern"], str(r["comparison"]))
        groups = {f"g{i}": g for i, g in enumerate(m.groups() if m else (), start=1) if g is not None}
        names = [t.format(a=a, b=b, **groups) for t in ([spec["of"]] if isinstance(spec["of"], str) else spec["of"])]
        of = next((n for n in names if first(n) is not None), names[0])  # the first reference the table has
        ref = first(of)
        scaled = spec["share"] * abs(float(ref["relative difference"])) if ref is not None else 0.0
        margin = max(scaled, resolution)
        how = (f"{spec['share']:.0%} of '{of}' on valid" if scaled >= resolution and ref is not None else
               f"the half-width of its CI on valid, wider than {spec['share']:.0%} of '{of}' there" if ref is not None
               else f"the half-width of its CI on valid; no row '{of}'")
        sign = "±" if key == "equivalent" else ""
        size = (f"{c['unit'][0] * margin:.3f} {c['unit'][1]}" if c.get("unit") else f"{100 * margin:.2f} %")
        return {**c, key: margin, "margin_from": how, "claim": f"{c['claim']}: here {sign}{size} ({how})"}
    return c


def _chosen(c: dict, df: pd.DataFrame, sel: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """(claim `c` saying which row it chose, the test row of `sel` it rests on) for a claim with 'choose' ('lowest' /
    'highest'): among the comparisons of `sel` (test rows), the one whose relative difference on valid in `df` is the
    lowest / highest; the choice is made on valid, test only measures. Without valid rows, `sel` unchanged."""
    valid = df[(df["split"] == "valid") & df["comparison"].isin(set(sel["comparison"]))]
    valid = valid[valid["relative difference"].notna()]
    if valid.empty:
        return c, sel
    best = valid["relative difference"].idxmin() if c["choose"] == "lowest" else valid["relative difference"].idxmax()
    pick = valid.loc[best, "comparison"]
    text = (f"{c['claim']} (the row chosen on valid: the {c['choose']} relative difference of {len(valid)} "
            f"({100 * valid.loc[best, 'relative difference']:+.1f} % on valid))")
    return {**c, "claim": text}, sel[sel["comparison"] == pick]


def _tau1_sides(c: dict, r: pd.Series, sources: dict) -> dict[str, str]:
    """The sides of comparison row r (claim `c`) compared at τ = 1 that have a τ-tuned twin in this run: {setting:
    the verdict of its 'X τ* vs X' row on valid} (Table 1's rows for Table 1 and the parametric kNN-LMs, the store's
    own rows for Sec. 5). Which row carries the verdict is chosen on valid, where τ* was tuned; test only measures.
    Every claim is read this way, whatever its kind ('paper', 'ours', 'follow-up'); a claim about τ itself (a 'tau*'
    claim, a row naming a τ* side, a reported number) has none. Only a FAISS mask + FAISS score side counts (every
    kNN-LM of Table 1 and of the parametric tables is one): the paper's τ = 1 stands for a near-optimal τ there alone
    (Sec. 5.2, "temperature t = 1 is close to optimal when using FAISS mask, FAISS score"); with a real mask or a real
    score the paper's τ = 1 is its own setting (ibid.: "When using either 'real mask' or 'real score', this is not
    true anymore"), compared as the paper compares it (docs/statistics.md)."""
    cmp_ = str(r["comparison"])
    if not c["tau1"] or (TUNED in cmp_ and not isinstance(r.get("τ settings"), str)):
        return {}
    tau_star = SOURCES.get(c["source"], {}).get("tau_star") or {}
    if isinstance(r.get("τ settings"), str):  # a row that names the settings it rests on and where their τ* rows are
        names, src = [n for n in r["τ settings"].split("; ") if n], r.get("τ source") or c["source"]
    elif tau_star.get("sides") == "knn":
        # the kNN-LMs it names: the one on the alternatives' rows has its own τ* row in the source's table, the
        # others in the table of 'tau_star' (Table 1's)
        names = [n for n in re.findall(r"kNN-LM (\S+/\S+(?: on the subset)?(?: τ\*)?)", cmp_) if not n.endswith("τ*")]
        sub = [n for n in names if n.endswith(SUBSET)]
        if sub:
            df = sources.get(c["source"], (None, ""))[0]
            valid = df[df["split"] == "valid"].set_index("comparison")["verdict"]
            return {n: str(valid[f"kNN-LM {n}{TUNED} vs kNN-LM {n}"]) for n in sub
                    if f"kNN-LM {n}{TUNED} vs kNN-LM {n}" in valid.index}
        src = tau_star["table"]
    elif tau_star.get("sides") == "store_vs_full":
        # '<setting> (<store> vs full)', '<setting> (<store> vs the line from …)': its τ* row on the full store, in
        # the table of 'tau_star'
        names, src = [re.sub(r" \(.+\)$", "", cmp_)], tau_star["table"]
    elif cmp_.startswith("share of the gain: "):  # 'share of the gain: ffn/L2 of att/L2'
        names, src = re.findall(r"\w+/\w+", cmp_), c["source"]
    else:
        names, src = [n for n in cmp_.split(" vs ") if n != "base"], c["source"]
    names = [n for n in names if n not in (FAISS_REAL, REAL_REAL)]  # a real mask or score: the paper's τ = 1
    df = sources.get(src, (None, ""))[0]
    if df is None or df.empty or not names:
        return {}
    valid = df[df["split"] == "valid"].set_index("comparison")["verdict"]
    return {n: str(valid[f"{n}{TUNED} vs {n}"]) for n in names if f"{n}{TUNED} vs {n}" in valid.index}


def _tau1_off(c: dict, r: pd.Series, sources: dict, sides: dict[str, str] | None = None) -> str:
    """The sides of row r compared at τ = 1 (_tau1_sides, or `sides` when already read) whose τ* beats τ = 1 beyond
    the CI on valid ('X τ* vs X' lower), joined by ', '; '' when τ = 1 is as good as τ* for each of them (or the row
    has none)."""
    sides = _tau1_sides(c, r, sources) if sides is None else sides
    return ", ".join(n for n, v in sides.items() if v == "lower")


def _tested(c: dict, r: pd.Series, label: str, counts: dict, min_documents: int, scheme: str = "",
            base_undertrained: bool = False, tau1_off: str = "", at_tau1: bool | None = None) -> dict:
    """The findings row of claim `c` on comparison row `r` (its verdict counted in `counts`); a row whose documents
    count fewer than `min_documents` (config 'stats.min_documents') as its interval counts them (column 'effective
    documents', Kish's; the raw count without it) is 'inconclusive (N articles, n_eff E)'. scheme: the documents
    scheme, naming the unit; base_undertrained: the base LM is under-trained (base_lm_undertrained), so a verdict
    ('reproduced', 'contradicted') says '(base LM under-trained)'. A row's 'flag' (a τ* on its grid's edge) is added
    to its verdict in parentheses; a row's 'premise' (why the paper's premise fails here) makes it PREMISE_ABSENT.
    tau1_off (_tau1_off): the settings whose τ* beats the paper's τ = 1 in this run: the row is then reported
    (TAU1_OFF), its verdict is the τ* twin's. The row's '_rules' lists each rule of RULES that replaced or qualified
    its verdict with the verdict it would have had without it, in the order applied (rules_table counts them)."""
    from ..statistics.documents import unit_count

    if isinstance(c["within"], dict) or isinstance(c["equivalent"], dict) or isinstance(c["about"], dict):
        raise ValueError(f"claim {c.get('id')!r}: its margin is derived from the run's rows; pass it through _with_margin")
    paper, sign = _paper(c, r["comparison"].split(" vs ", 1)[-1])
    docs = int(r["documents"]) if "documents" in r and pd.notna(r["documents"]) else None
    eff = float(r["effective documents"]) if "effective documents" in r and pd.notna(r["effective documents"]) else None
    n_for_verdict = eff if eff is not None else docs
    units = "-" if docs is None else unit_count(docs, scheme) + (f" (n_eff {eff:.1f})" if eff is not None else "")
    if not label and isinstance(r.get("on"), str):  # the source's rows say what they rest on (App. D, E.1-E.4)
        label = r["on"]
    premise = r.get("premise") if isinstance(r.get("premise"), str) and r.get("premise") else ""
    rules = []  # (rule of RULES, the verdict the row would have had without it): the rules table counts them
    if c["count_zero"]:
        v = {"none": "reproduced", "some": "contradicted"}.get(r["verdict"], "inconclusive (unresolved)")
    elif c["verdicts"]:
        v = c["verdicts"].get(r["verdict"], "inconclusive")
    elif c["reported"]:
        v = "reported"
    elif c["share"] is not None or c["size"] is not None:  # a stated value (a share, a size) ± its band
        stated = c["share"] if c["share"] is not None else c["size"]
        v = band_verdict(r["CI low"], r["CI high"], stated - c["about"], stated + c["about"])
    elif c["equivalent"] is not None:
        v = band_verdict(r["CI low"], r["CI high"], -c["equivalent"], c["equivalent"])
    elif c["within"] is not None:
        v = within_verdict(r["CI low"], r["CI high"], c["within"])
    else:  # (a premise-absent row may have no CI verdict)
        v = paper_verdict(r["verdict"], sign) if isinstance(r.get("verdict"), str) else "inconclusive"
    by_ci = not (c["count_zero"] or c["verdicts"] or c["reported"])  # a verdict from the CI: the minimum applies
    if premise:
        rules.append(("premise absent", v))
        v = PREMISE_ABSENT
    elif by_ci and n_for_verdict is not None and n_for_verdict < min_documents:
        few = f"inconclusive ({unit_count(docs, scheme)}" + (f", n_eff {eff:.1f})" if eff is not None else ")")
        if isinstance(r.get("n_eff of"), str) and r["n_eff of"]:  # no outcome on these documents could decide it
            few = few[:-1] + f" < {min_documents} by construction: {r['n_eff of']})"
            rules.append(("too few documents by construction", v))
        else:
            rules.append(("too few documents", v))
        v = few
    verdict_given = v != PREMISE_ABSENT and not v.startswith("inconclusive")  # what the qualifiers below may turn
    if str(r.get("converged", "yes")).startswith("no") and verdict_given and _alternative_looks_worse(c, r):
        rules.append(("under-trained alternative", v))
        v = "inconclusive (under-trained)"
    elif _fewer_rows(r) and verdict_given and _alternative_looks_worse(c, r):
        rules.append(("subset-trained alternative", v))
        v = "inconclusive (subset-trained)"
    if "converged" in r:
        trained = "" if str(r["converged"]).startswith("yes") else ", under-trained"
        label = f"{label or 'all tokens'}; {int(r['steps'])} steps{trained}"
    if tau1_off and v != PREMISE_ABSENT and not v.startswith("inconclusive ("):
        rules.append(("τ = 1 off τ*", v))
        v = TAU1_OFF
    if base_undertrained and v in ("reproduced", "contradicted"):
        rules.append(("base LM under-trained", v))
        v = f"{v} (base LM under-trained)"
    counts[v] = counts.get(v, 0) + 1
    if by_ci and not v.startswith(("inconclusive (", "not tested", "reported")):
        # one measurement, one row: what else the claim states of the same number is shown beside its verdict (not
        # counted): the sign a stated size ("nearly 4 % better") or an "about as good, slightly better" also states,
        # and a one-sided bound ("more than half")
        also = []
        if c["size"] is not None and v.startswith(("contradicted", "inconclusive")):
            also.append(f"its sign: {paper_verdict(r['verdict'], -1 if c['size'] < 0 else 1)}")
        elif c["equivalent"] is not None and c["sign"] is not None and isinstance(r.get("verdict"), str):
            also.append(f"its sign: {paper_verdict(r['verdict'], c['sign'])}")
        for bound in c["also"] or []:  # {says, above: x}: the CI above x; {says, below: x}: the CI below x
            lo, hi = r["CI low"], r["CI high"]
            holds, fails = (lo > bound["above"], hi < bound["above"]) if "above" in bound else \
                (hi < bound["below"], lo > bound["below"])
            also.append(f"{bound['says']}: " + ("reproduced" if holds else "contradicted" if fails else "inconclusive"))
        if also:
            v = f"{v} ({'; '.join(also)})"
    if premise:
        v = f"not tested (premise absent: {premise})"
    elif isinstance(r.get("flag"), str) and r["flag"] and v != "reported":
        rules.append(("τ* on its grid's edge", v.split(" (")[0]))
        v = f"{v} ({r['flag']})"
    fmt = "{:.1f}" if c["share"] is not None else "{:+.2f}" if c["source"] in CONTRAST_SOURCES else "{:+.1f}"
    if c["count_zero"]:
        n, most = int(r["CI low"]), int(r["CI high"])
        ours = f"{n} word{'' if n == 1 else 's'}" + (f" (up to {most}: {most - n} unresolved)" if most > n else "")
    elif c["unit"]:
        k, unit = c["unit"]
        ours = (f"{k * r['relative difference']:+.3f} [{k * r['CI low']:+.3f}, {k * r['CI high']:+.3f}] {unit}")
    else:
        ours = " ".join([fmt.format(100 * r["relative difference"]), "%",
                         f"[{fmt.format(100 * r['CI low'])}, {fmt.format(100 * r['CI high'])}]"])
    at_tau1 = c["tau1"] if at_tau1 is None else at_tau1
    test = KIND[c["kind"]] + (f", at τ = 1 (τ* differs: {tau1_off})" if tau1_off else ", at τ = 1" if at_tau1 else "")
    return {"section": c["section"], "claim": c["claim"], "test": test, "comparison (a vs b)": r["comparison"],
            "paper": paper, "ours (test, 95% CI)": ours, "on": label or "all tokens", "units": units, "verdict": v,
            "_rules": rules}


def vocabulary_size(job: Job) -> int | None:
    """V, the base LM's vocabulary size, from input 'vocabulary': a fairseq LM's binarised data (its dict.txt and
    fairseq's 4 special symbols) or a Hugging Face LM's model card ('vocab_size'); None without it."""
    if not job.input.get("vocabulary"):
        return None
    p = job.path("vocabulary")
    if p.is_dir():
        with open(p / "dict.txt", encoding="utf-8") as f:
            return 4 + sum(1 for line in f if line.strip())
    return read_json(p).get("vocab_size")


def regime_values(job: Job, settings: dict | None) -> dict[str, tuple[float, str]]:
    """This run's value of each regime axis (REGIME) with its text: 'lm', the base LM's test perplexity per word
    (input 'table1_table'); 'store', the datastore's rows per vocabulary entry (the Table 3 store's N, from its
    settings JSON `settings`, over V, input 'vocabulary'); 'scan', the keys its FAISS search scanned per test query as
    a multiple of k (config 'knn.k'), with its recall@k. An axis the inputs do not give is left out (not measured)."""
    out = {}
    if job.input.get("table1_table"):
        t = pd.read_csv(job.path("table1_table"))
        base = t[(t["split"] == "test") & (t["model"] == "Base LM")]
        if len(base):
            v = float(base["PPL (word)"].iloc[0])
            out["lm"] = (v, f"{v:,.2f}")
    vocab = vocabulary_size(job)
    meta = (settings or {}).get("store_meta") or {}
    n = meta.get("size") or meta.get("N")  # the store's own rows (a subset's 'size'; 'N' is its parent's)
    if n and vocab:
        out["store"] = _store_value(n, vocab)
    scan = ((settings or {}).get("scan") or {}).get("test") or {}
    if scan.get("keys_scanned_per_query"):
        m = scan["keys_scanned_per_query"] / job.cfg["knn"]["k"]
        rec = settings["recall"].get("test") if isinstance(settings.get("recall"), dict) else None
        out["scan"] = (m, f"{m:,.1f}·k" + (f", recall@k {rec:.2f}" if rec is not None else ""))
    return out


def _in_regime(axis: str, values: dict) -> bool | None:
    """Whether this run's value of regime axis `axis` lies within its factor of the paper's (None: not measured)."""
    if axis not in values:
        return None
    a = REGIME[axis]
    return a["paper"] / a["factor"] <= values[axis][0] <= a["paper"] * a["factor"]


def regime_rows(values: dict) -> list[dict]:
    """The regime table that heads the findings: per axis of REGIME, the paper's value, this run's, and whether it
    counts as the paper's regime (within the axis's factor), with the paper's source."""
    rows = []
    for axis, a in REGIME.items():
        inside = _in_regime(axis, values)
        rows.append({"axis": a["name"], "the paper": f"{a['paper']:,g}", "this run": values[axis][1] if axis in values
                     else "not measured", f"the paper's regime (within a factor)": "-" if inside is None else
                     (f"yes (×{a['factor']:g})" if inside else f"no (×{values[axis][0] / a['paper']:.2g}; "
                      f"within ×{a['factor']:g} counts)"), "source": a["source"]})
    return rows


def headroom(job: Job) -> tuple[float, str, float] | None:
    """The base LM's headroom, what continued training measured rather than a 'converged' label: (the relative change
    of the best valid perplexity per token (fairseq's validation) of the LMs trained on from the base LM without
    dropout (App. E.6.1's, input 'headroom': their training.json) against the base LM's own best (input
    'lm_training'), the LM that reached it with the updates it took past the base LM (through config
    'headroom_init_from', {LM: the LM it continued}, a chain adds up), the base LM's best); None without both inputs."""
    if not job.input.get("headroom") or not job.input.get("lm_training"):
        return None
    base = read_checked_json(job.paths("lm_training")[0], "lm_training")
    best = min(p for _, p in base["valid"])
    runs = {Path(p).parent.name: read_checked_json(p, "lm_training") for p in job.paths("headroom")}
    parent = job.cfg.get("headroom_init_from") or {}

    def past_base(name, seen=()):  # updates from the base LM to `name` along its chain of init_from
        up = parent.get(name)
        return runs[name]["updates"] + (past_base(up, seen + (name,)) if up in runs and up not in seen else 0)

    change, name = min((min(p for _, p in t["valid"]) / best - 1, n) for n, t in runs.items())
    return change, f"{name}: {past_base(name):,} more updates", best


def headroom_row(h: tuple[float, str, float] | None) -> dict | None:
    """The regime table's row on the base LM's headroom `h` (headroom); None without it."""
    if h is None:
        return None
    change, who, best = h
    return {"axis": "base LM headroom: best valid perplexity (per token) of the base LM trained on without dropout "
                    "(App. E.6.1's LMs) against its own", "the paper": "converged (Sec. 3; not measured)",
            "this run": f"{100 * change:+.1f} % ({who}; the base LM's best {best:.2f})",
            "the paper's regime (within a factor)": "-",
            "source": "the LMs of config 'hypotheses.overfit_lms' (fairseq's validation, blocks without the context "
                      "window)"}


def base_lm_undertrained(job: Job, h: tuple[float, str, float] | None) -> str:
    """Why the base LM counts as under-trained, '' when it does not (rule 'base LM under-trained'): its valid
    perplexity was still falling when training stopped (input 'lm_training'), or training it further (`h`, its
    headroom) lowered its best valid perplexity by more than the tolerance its own training judged convergence by."""
    if not job.input.get("lm_training"):
        return ""
    t = read_checked_json(job.paths("lm_training")[0], "lm_training")
    if t["converged"].startswith("no"):
        return "its valid perplexity was still falling when training stopped"
    tol = float(t.get("tolerance", 0.01))
    if h is not None and h[0] < -tol:
        return (f"training it further lowered its best valid perplexity by {-100 * h[0]:.1f} % ({h[1]}), more than "
                f"the {100 * tol:g} % its training judged convergence by")
    return ""


def _store_value(rows: int, vocab: int) -> tuple[float, str]:
    """The regime's store axis for a datastore of `rows` over a vocabulary of `vocab` entries: (rows per entry, text)."""
    return rows / vocab, f"{rows / vocab:,.0f} ({rows:,} rows over {vocab:,} entries)"


def _short(axis: str, value: float) -> str:
    """A value of regime axis `axis` as a regime column names it ('339', '23.7·k', '1,170·k')."""
    return (f"{value:,.3g}" if value < 1000 else f"{value:,.0f}") + ("·k" if axis == "scan" else "")


def row_regime_values(values: dict, by_store: dict, source: str, r: pd.Series, vocab: int | None) -> dict:
    """The regime values of one findings row: those of the store its source reads (`by_store`: {source: values} for
    the subset stores' sources, the Table 3 store's `values` otherwise), and for a parametric row against the kNN-LM
    on the alternatives' rows, that datastore's own rows per vocabulary entry (column 'reference rows' over V)."""
    out = dict(by_store.get(source, values))
    try:
        rows = int(r["reference rows"])
    except (KeyError, TypeError, ValueError):
        return out
    if vocab and SUBSET in str(r.get("comparison", "")):
        out["store"] = _store_value(rows, vocab)
    return out


def regime_label(c: dict, values: dict) -> str:
    """The regime column of claim `c`'s rows: the axes its claim rests on (its 'regime') where this run is outside
    the paper's regime, each with the row's own value and the paper's ('datastore rows per vocabulary entry: 17, the
    paper's 5,000'), 'the paper's' where none is, and the axes not measured."""
    axes = c.get("regime") or []
    out = [f"{REGIME[a]['name']}: {_short(a, values[a][0])}, the paper's {_short(a, REGIME[a]['paper'])}"
           for a in axes if _in_regime(a, values) is False]
    unmeasured = [REGIME[a]["name"] for a in axes if _in_regime(a, values) is None]
    text = ("differs: " + "; ".join(out)) if out else "the paper's" if axes else "-"
    return text + (f" (not measured: {'; '.join(unmeasured)})" if unmeasured else "")


def findings(job: Job) -> dict:
    """The findings report (Markdown): every claim of CLAIMS with the paper's number, ours (test split) with its
    95 % CI, and the verdict; a claim the run has no row for is listed as 'not run (why)'."""
    from .common import documents_scheme

    small = read_checked_json(job.path("small_store"), "settings") if job.input.get("small_store") else None
    sources = _sources(job, small)
    scheme = documents_scheme(job)["scheme"] if job.input.get("documents") else job.cfg["stats"]["documents"]
    room = headroom(job)
    why_undertrained = base_lm_undertrained(job, room)
    undertrained = bool(why_undertrained)
    t3 = read_checked_json(job.path("table3_settings"), "settings") if job.input.get("table3_settings") else None
    values = regime_values(job, t3)
    vocab = vocabulary_size(job)
    by_store = {}  # the sources that read a subset store: its own rows per entry and scan (the LM axis is shared)
    if small is not None:
        by_store.update({src: regime_values(job, small) for src in SMALL_SOURCES})
    if job.input.get("large_store"):
        large = regime_values(job, read_checked_json(job.path("large_store"), "settings"))
        by_store.update({src: large for src in SOURCES if source_has(src, "store", "large")})
    rows, counts, by_regime = [], {}, {"the paper's": {}, "another": {}}
    def not_run(c: dict, why: str) -> None:  # a claim without a measurement still has its row (no silent claim)
        rows.append({"section": c["section"], "claim": c["claim"], "test": KIND[c["kind"]],
                     "comparison (a vs b)": c["shown"], "paper": _paper(c, None)[0],
                     "ours (test, 95% CI)": "not run", "on": "-", "units": "-", "verdict": why, "regime": "-",
                     "_claim": c["id"]})
        counts[why] = counts.get(why, 0) + 1

    for c in CLAIMS:
        df, label = sources.get(c["source"], (None, ""))
        if c["source"] in SMALL_SOURCES and small is not None and abs(small["ratio"] - 0.05) > 1e-9:
            c = {**c, "claim": c["claim"].replace("5 % datastore", f"{small['ratio']:.0%} datastore (the paper's: 5 %)")}
        sel = None if df is None or df.empty else df[(df["split"] == "test") & df["comparison"].str.fullmatch(c["pattern"])]
        if sel is not None and c["ref"] is not None and "reference" in sel:
            sel = sel[sel["reference"].fillna("").str.contains(c["ref"], regex=False)]
        if (sel is None or sel.empty) and c["kind"] in ("ours", "tau*"):
            # an extra comparison this run does not have (e.g. no kNN-LM other than the paper's, no τ* twin)
            not_run(c, "not run (no such comparison in this run)")
            continue
        if sel is None or sel.empty:
            left_out = c["source"] in FOLLOWUP_SOURCES and not job.cfg.get("extras", {}).get("in_all", True)
            not_run(c, "not run (target 'extras')" if left_out else
                    f"not run (no '{c['source']}' table in this run)" if df is None or df.empty else
                    "not run (no such comparison in this run)")
            continue
        if c["choose"]:  # the row the claim rests on, chosen on valid
            c, sel = _chosen(c, df, sel)
        if source_has(c["source"], "equal_rows"):  # on fewer rows: tested at equal rows
            sel = sel[[not _equal_rows_twin(r, df) for _, r in sel.iterrows()]]
            if sel.empty:  # every row of the claim is tested against the kNN-LM on the alternatives' own rows
                not_run(c, "not run (tested at equal rows: the claims against the kNN-LM on the alternatives' rows)")
                continue
        for _, r in sel.iterrows():
            sides = _tau1_sides(c, r, sources)
            row = _tested(_with_margin(c, r, df), r, label, counts, job.cfg["stats"]["min_documents"], scheme,
                          undertrained, _tau1_off(c, r, sources, sides), bool(sides))
            row["regime"] = regime_label(c, row_regime_values(values, by_store, c["source"], r, vocab))
            row["_claim"] = c["id"]
            where = by_regime["the paper's" if row["regime"].startswith("the paper's") else "another"]
            kind = row["verdict"].split(" (")[0]
            where[kind] = where.get(kind, 0) + 1
            rows.append(row)
    cfg, rules = job.cfg, rules_table(rows)
    text = [f"# Findings ({cfg['name']}): the claims of Xu et al. (2023), and of the follow-ups Drozdov et al. "
            f"(2022) and He et al. (2021), tested on this run\n\n",
            f"{LEGEND}\n\n",
            f"Summary: {', '.join(f'{n} {k}' for k, n in sorted(counts.items())) or 'nothing tested'}. "
            f"{lm_training_label(job)} "
            f"{ci_caption(cfg['stats'])}; 'units' = the test units a row rests on (its resampling unit, with Kish's "
            f"effective number n_eff that the interval and the minimum count)."
            + (f" The base LM is under-trained ({why_undertrained}): every verdict says so and is counted apart."
               if undertrained else "")
            + (" The base LM has an adaptive softmax (config 'lms.<lm>.adaptive_softmax'): no single output matrix "
               "W_sm, so the claims that need it (the parametric alternatives of Sec. 4 and App. B-C, App. E.1-E.4 and "
               "E.6.3, and the follow-ups' per-token features) are not run." if cfg.get("adaptive_softmax") else "")
            + "\n\n",
            "Regime: where this run stands against the paper on what its claims may depend on (claims.yaml 'regime'; "
            "each row's 'regime' names the axes its claim rests on where this run is outside the paper's regime). "
            + "; ".join(f"verdicts in {w} regime: " + (", ".join(f"{n} {k}" for k, n in sorted(v.items())) or "none")
                        for w, v in by_regime.items()) + ".\n\n",
            pd.DataFrame(regime_rows(values) + [r for r in [headroom_row(room)] if r]).to_markdown(index=False)
            + "\n\n",
            "Rules: every rule that replaces or qualifies a verdict (claims.yaml 'rules'), the rows it touched and "
            "the verdict each would have had without it ('would be neither': inconclusive, reported). A rule that "
            "withholds only one direction leans the report that way unless its basis says why.\n\n",
            rules.to_markdown(index=False) + "\n\n",
            pd.DataFrame(rows).drop(columns=["_claim", "_rules"], errors="ignore").to_markdown(index=False) + "\n\n",
            scope_power(job, small) + "\n\n",
            "Names: faiss_mask_faiss_score = FAISS mask, FAISS score (the usual kNN-LM); faiss_mask_real_score = "
            "FAISS neighbours, distances recomputed from the keys; real_mask_real_score = exact top-k; ' τ*' = at the "
            "τ tuned on valid (λ re-tuned). 'on' says which keys / store a row used; Table 1 rows and rows whose 'on' "
            "says 'all tokens' use all tokens of the split (or the block sample it names), the others the retrieval scope.\n"]
    with atomic_path(job.path("out")) as tmp:
        tmp.write_text("".join(text))
    artifacts = [job.path("out")]
    if job.output.get("figure"):
        artifacts += findings_summary_figure(rows, f"Findings of the {cfg['name']} run: the verdict of each row, by "
                                                   f"part of the paper ({len(rows)} rows; legend: docs/verdicts.md)",
                                             [job.path("figure")])
    if job.output.get("rows"):  # the same rows, each with its claim's id: the regime map's findings join on it
        write_json(job.path("rows"), {"rows": [{{"_claim": "claim id", "_rules": "rules"}.get(k, k): v
                                                for k, v in r.items()} for r in rows], "summary": counts,
                                      "rules": rules.to_dict(orient="records")})
        artifacts.append(job.path("rows"))
    return {"metrics": {"n_" + re.sub(r"[^0-9A-Za-z_]+", "_", k).strip("_"): n for k, n in counts.items()},
            "artifacts": artifacts}
