"""How large a sample (knnlm.experiments.sample_size): the block samples it draws and the rule that picks a size."""
import numpy as np
import pytest

from knnlm.experiments.sample_size import choose
from knnlm.search.scope import block_sample

pytestmark = pytest.mark.unit


def test_block_sample_keeps_every_document_and_its_share():
    """A fraction f of a token list is about f of its tokens, every document gives one block of about f of its own
    tokens, the positions are sorted and unique; f = 1 is every token; f <= 0 is refused."""
    rng = np.random.default_rng(3)
    sizes = rng.integers(50, 3000, size=40)
    doc = np.repeat(np.arange(40), sizes)
    words = (rng.random(len(doc)) < 0.75).astype(np.int64)
    for f in (0.1, 0.3, 0.5, 0.9):
        sub = block_sample(doc, words, f, seed=1)
        assert np.all(np.diff(sub) > 0)
        assert abs(len(sub) - f * len(doc)) <= 40 * 8  # a block ends on a word: within a few tokens per document
        per_doc = np.bincount(doc[sub], minlength=40)
        assert (per_doc > 0).all() and np.allclose(per_doc / sizes, f, atol=0.05)
    np.testing.assert_array_equal(block_sample(doc, words, 1.0, seed=1), np.arange(len(doc)))
    with pytest.raises(ValueError, match="fraction must be > 0"):
        block_sample(doc, words, 0.0, seed=1)


def _rows(spec):
    """Rows of table 'sample_size': {fraction: [(width ratio, same verdict), ...]} on test, plus a valid row that
    never fits (the rule reads test only)."""
    rows = [{"fraction": f, "split": "test", "width / every token": w, "same verdict": v}
            for f, cs in spec.items() for w, v in cs]
    return rows + [{"fraction": f, "split": "valid", "width / every token": 9.0, "same verdict": False} for f in spec]


def test_choose_takes_the_smallest_fraction_below_which_nothing_fits():
    """The smallest fraction whose every comparison is within the ratio with its verdict, and so is every larger
    one; a larger fraction that breaks the rule stops the walk; None when only every token fits."""
    spec = {1.0: [(1.0, True), (1.0, True)], 0.8: [(1.05, True), (1.1, True)], 0.6: [(1.14, True), (1.12, True)],
            0.4: [(1.2, True), (1.3, True)], 0.2: [(1.1, True), (1.1, True)]}
    assert choose(_rows(spec), 1.15) == 0.6
    assert choose(_rows(spec), 1.3) == 0.2
    assert choose(_rows(spec), 1.0) is None
    spec[0.6] = [(1.01, False), (1.0, True)]  # a verdict changes: the walk stops at 0.8
    assert choose(_rows(spec), 1.15) == 0.8
    assert choose(_rows(spec), 1.15, split="valid") is None
