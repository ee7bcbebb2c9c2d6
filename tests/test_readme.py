"""The README's Python example runs as written (issue 24: broadcasting, indexing and a scheduler in one training
step), on the device clnet picks by itself, as a new user's first lines would."""
import os

import numpy as np

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def python_example():
    """The first ```python block after the README's "## Python" heading."""
    text = open(README, encoding="utf-8").read()
    return text.split("\n## Python\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_python_example_runs_as_written(capsys):
    ns = {"__name__": "readme_example"}
    exec(compile(python_example(), "README.md (the Python example)", "exec"), ns)
    loss, model, opt, sched = ns["loss"], ns["model"], ns["opt"], ns["sched"]
    assert np.isfinite(loss.item()) and loss.item() > 0
    assert all(p.grad is not None and np.isfinite(p.grad.numpy()).all() for p in model.parameters())
    assert sched.get_last_lr() == [1e-3], "StepLR(step_size=10) keeps the lr for the first steps"
    printed = capsys.readouterr().out
    assert "(2, 3)" in printed, f"the example prints the indexed shape: {printed!r}"
