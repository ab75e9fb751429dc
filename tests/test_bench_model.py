"""The ``model`` bench topic: every backend inside the LM runs and gives the sequential logits."""

import pytest

from course.bench import model as BM


@pytest.mark.cpu  # the topic's CPU run (gpu=False): CPU tensors, Triton's interpreter
@pytest.mark.parametrize("block", ["mamba1", "mamba2"])
def test_model_topic_backends_agree(block):
    rows = BM.run(gpu=False, blocks=(block,))
    names = [r["backend"] for r in rows]
    assert "sequential" in names and "triton" in names and len(names) >= 3
    for r in rows:
        assert r["ms"] > 0
        assert r["logits_rel_err"] < 1e-5, r
