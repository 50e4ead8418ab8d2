"""Soft-label training of a fresh LM from a teacher LM's distribution (Xu et al. 2023, App. E.6.2; Hinton et al.
2015): the fairseq criterion 'soft_label_cross_entropy' and the fairseq-train entry point that registers it.

Run as `python -m knnlm.lm.soft_labels <fairseq-train arguments> --criterion soft_label_cross_entropy
--teacher-checkpoint T --soft-label-weight w` (knnlm.lm.training.train_command builds it for an 'lms' entry with a 'teacher').
"""
import math
from dataclasses import dataclass, field

import torch
from fairseq import checkpoint_utils, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics


def soft_label_loss(lprobs: torch.Tensor, teacher_probs: torch.Tensor, target: torch.Tensor, weight: float,
                    pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The soft-label objective and the plain cross-entropy, summed over the non-padding tokens (nats).

    objective = −Σ_t [(1 − w) log p(y_t) + w Σ_v q_t(v) log p_t(v)]: cross-entropy against the label
    (1 − w)·one-hot(y_t) + w·q_t, q_t the teacher's distribution. lprobs: [T, V] float log p of the student;
    teacher_probs: [T, V] float q (rows sum to 1); target: [T] int64 token ids; pad: the padding id (skipped).
    Returns (objective, nll), 0-dim tensors; nll = −Σ_t log p(y_t)."""
    keep = target.ne(pad)
    nll_tok = -lprobs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    soft_tok = -(teacher_probs * lprobs).sum(-1)
    objective = ((1.0 - weight) * nll_tok + weight * soft_tok)[keep].sum()
    return objective, nll_tok[keep].sum()


@dataclass
class SoftLabelConfig(FairseqDataclass):
    teacher_checkpoint: str = field(default="", metadata={"help": "fairseq checkpoint of the teacher LM (same dictionary)"})
    soft_label_weight: float = field(default=0.5, metadata={"help": "w: the label is (1 − w)·one-hot + w·teacher"})


@register_criterion("soft_label_cross_entropy", dataclass=SoftLabelConfig)
class SoftLabelCrossEntropy(FairseqCriterion):
    """Cross-entropy against (1 − w)·one-hot + w·(the teacher's distribution), the teacher frozen in eval mode (no
    dropout). Logs 'loss' = the plain cross-entropy of the label (bits per token, what perplexity, the valid curve and
    checkpoint_best measure, as fairseq's 'cross_entropy' criterion) and 'objective' = the trained soft-label loss."""

    def __init__(self, task, teacher_checkpoint: str, soft_label_weight: float):
        super().__init__(task)
        if not teacher_checkpoint:
            raise ValueError("soft_label_cross_entropy needs --teacher-checkpoint")
        if not 0.0 <= soft_label_weight <= 1.0:
            raise ValueError(f"--soft-label-weight must be in [0, 1], found {soft_label_weight}")
        models, _ = checkpoint_utils.load_model_ensemble([teacher_checkpoint], task=task)
        self.teacher = models[0].eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.weight = soft_label_weight
        if torch.cuda.is_available():
            self.teacher.cuda()

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        with torch.no_grad():
            self.teacher.eval()
            t_out = self.teacher(**sample["net_input"])
            t_probs = self.teacher.get_normalized_probs(t_out, log_probs=False).to(lprobs.dtype)
        target = model.get_targets(sample, net_output)
        objective, nll = soft_label_loss(lprobs.view(-1, lprobs.size(-1)), t_probs.view(-1, t_probs.size(-1)),
                                         target.view(-1), self.weight, self.padding_idx)
        logging_output = {"loss": nll.data, "objective": objective.data, "ntokens": sample["ntokens"],
                          "nsentences": sample["target"].size(0), "sample_size": sample["ntokens"]}
        return objective, sample["ntokens"], logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        objective = sum(log.get("objective", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / ntokens / math.log(2), ntokens, round=3)
        metrics.log_scalar("objective", objective / ntokens / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def main() -> None:
    """fairseq-train with this module's criterion registered."""
    from fairseq_cli.train import cli_main

    cli_main()


if __name__ == "__main__":
    main()
