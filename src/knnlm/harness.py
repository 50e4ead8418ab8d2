"""A kNN-LM (Eq. 5 of Xu et al. 2023) as an lm-evaluation-harness model, so that any harness task runs on it.

    python -m knnlm.harness --model knnlm --model_args bundle=DIR[,lam=0.25,temperature=1.0,k=1024] --tasks TASK ...

(the harness's own command line, with this model registered as 'knnlm'), or from Python
`lm_eval.simple_evaluate(model=HarnessKNNLM(knn=KNNLM.from_pretrained(DIR)), tasks=[...])`. Needs the optional
extra `harness` (`pip install knnlm[harness]`: lm-eval).

Each request is scored as the harness's own Hugging Face model scores it (lm_eval.models.huggingface.HFLM): the
context's and continuation's tokens (the context's trailing spaces moved to the continuation), the last
`max_length` + 1 of them fed as one window, an empty context replaced by the prefix token (the LM's start token);
rolling log-likelihoods over the harness's disjoint windows (lm_eval.utils.get_rolling_token_windows). Every
predicted token's distribution is the interpolation (1 − λ) p_LM + λ p_kNN over the whole vocabulary
(KNNLM.knn_distribution and KNNLM.mix), its neighbours retrieved with the query of the kNN-LM's key type at that
position; is_greedy is whether every continuation token is the argmax of that distribution. At λ = 0 the
log-likelihoods are the LM's own, as the harness's 'hf' model gives them.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from .api import KNNLM

SETTINGS = ("k", "temperature", "lam", "lmbda", "knn_temp", "nprobe", "mask", "score")
HARNESS_ARGS = ("device", "max_batch_size")  # what the harness's command line passes every model (unused here)


@register_model("knnlm")
class HarnessKNNLM(TemplateLM):
    """The harness model of a kNN-LM: `bundle` a folder saved by KNNLM.save_pretrained (its Hugging Face LM loaded
    from what the bundle names, the keys verified unless verify=False), or `knn` a KNNLM already built. Settings
    k, temperature, lam (or the peers' lmbda, knn_temp), nprobe, mask, score override the bundle's. max_gen_toks:
    the default length of generate_until. Raises ValueError when neither or both of bundle and knn are given."""

    def __init__(self, bundle: str | None = None, knn: KNNLM | None = None, verify: bool = True,
                 max_gen_toks: int = 256, batch_size: int | str = 1, **settings):
        super().__init__()
        if (bundle is None) == (knn is None):
            raise ValueError("HarnessKNNLM needs one of bundle= (a folder of KNNLM.save_pretrained) and knn=")
        unknown = sorted(set(settings) - set(SETTINGS) - set(HARNESS_ARGS))
        if unknown:
            raise ValueError(f"knnlm model_args: unknown {unknown}; known: bundle, verify, max_gen_toks, {', '.join(SETTINGS)}")
        if bundle is not None:
            verify = verify if isinstance(verify, bool) else str(verify).lower() not in ("0", "false", "no")
            knn = KNNLM.from_pretrained(bundle, verify=verify, **{n: v for n, v in settings.items() if n in SETTINGS})
        self.knn = knn
        self.max_gen_toks = int(max_gen_toks)

    # ---- what TemplateLM asks of a model ----------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.knn.lm.start)

    @property
    def prefix_token_id(self) -> int:
        return int(self.knn.lm.start)

    @property
    def max_length(self) -> int:
        return int(self.knn.lm.tokens_per_sample)

    @property
    def tokenizer_name(self) -> str:
        return str(self.knn.lm.identity.get("model", "knnlm")).replace("/", "__")

    def tok_encode(self, string: str, **kwargs) -> list[int]:
        """The LM's tokens of `string`, no special tokens (KNNLM's LM encode_prompt)."""
        return [int(t) for t in self.knn.lm.encode_prompt(string)]

    # ---- the interpolated distribution ---------------------------------------------------------------------------
    @torch.inference_mode()
    def log_probs(self, tokens: list[int], n: int) -> np.ndarray:
        """[n, V] float64 log((1 − λ) p_LM + λ p_kNN) of the tokens following each of the last n positions of
        `tokens` (its last max_length fed as one window; the key of each position is its query)."""
        window = tokens[-self.max_length:]
        att, ffn, logits = self.knn.lm.forward(torch.as_tensor(window, dtype=torch.int64)[None])
        h = (att if self.knn.key == "att" else ffn)[0, -n:].float().cpu().numpy()
        lp_lm = logits[0, -n:].float().log_softmax(-1).cpu().numpy()
        return self.knn.mix(lp_lm, self.knn.knn_distribution(h))

    def _continuation(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """(log p(continuation | context), whether every continuation token is the argmax), as HFLM feeds them:
        (context + continuation)[-(max_length + 1):][:-1]."""
        whole = (list(context) + list(continuation))[-(self.max_length + 1):]
        n = len(continuation)
        lp = self.log_probs(whole[:-1], n)
        cont = np.asarray(continuation, dtype=np.int64)
        return float(lp[np.arange(n), cont].sum()), bool((lp.argmax(1) == cont).all())

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        out = []
        for key, context, continuation in requests:
            res = self._continuation(context, continuation)
            out.append(res)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in requests:
            (string,) = req.args
            windows = map(make_disjoint_window, get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1))
            total = sum(self._continuation(ctx, cont)[0] for ctx, cont in windows)
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    def greedy(self, context: list[int], max_tokens: int, until: list[str]) -> tuple[list[int], str]:
        """(token ids, text) of the greedy continuation of token ids `context` from the interpolated distribution:
        at most max_tokens tokens, stopped at the LM's end token or once the text holds one of `until` (the text is
        cut before it)."""
        new: list[int] = []
        text = ""
        for _ in range(max_tokens):
            t = int(self.log_probs(list(context) + new, 1)[0].argmax())
            if t == self.eot_token_id:
                break
            new.append(t)
            text = self.knn.lm.decode(new)
            if any(u in text for u in until):
                break
        for u in until:
            text = text.split(u)[0]
        return new, text

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """The greedy continuation (greedy) of each request's context, until gen_kwargs 'until', at most gen_kwargs
        'max_gen_toks' tokens (default max_gen_toks). Sampling is not offered: ValueError for do_sample."""
        out = []
        for req in requests:
            context, gen = req.args
            if gen.get("do_sample"):
                raise ValueError("knnlm: generate_until is greedy; do_sample is not supported")
            until = gen.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            _, text = self.greedy(self.tok_encode(context) or [self.prefix_token_id],
                                  int(gen.get("max_gen_toks", self.max_gen_toks)), until)
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen), text)
        return out


def main(argv=None) -> None:
    """The harness's command line with the 'knnlm' model registered (lm_eval's cli_evaluate)."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
