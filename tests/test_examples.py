"""The scripts in examples/ run as documented (on a short schedule) and report an accuracy above chance."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args", "pattern"),
    [
        ("digits_mixup.py", ["--max-epochs", "2", "--size", "8"], r"validation accuracy after 2 epochs: ([\d.]+)%"),
        (
            "digits_large_batch.py",
            ["--max-epochs", "2", "--size", "8", "--batch-size", "256", "--warmup-epochs", "1"],
            r"batch 256, 12 steps, scaled lr: validation accuracy ([\d.]+)%",
        ),
        (
            "long_tail_digits.py",
            ["--max-epochs", "2", "--size", "8"],
            r"RepeatFactorSampling\(threshold=0.1\): balanced accuracy ([\d.]+)%",
        ),
    ],
)
def test_example_runs_and_learns(script, args, pattern):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args, "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(pattern, done.stdout)
    assert found, done.stdout[-2000:]
    assert float(found.group(1)) > 30.0  # ten classes: chance is 10%
