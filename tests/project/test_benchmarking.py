"""scripts/benchmarking.py, the benches' shared timing and profiling: a part a step is
measured per may be absent from a path (CUDA's forward runs elsewhere), and the profile still
prints every part, with no ratio to the absent one."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "benchmarking.py"


def load_script():
    spec = importlib.util.spec_from_file_location("benchmarking", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarking"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def work():
    return sum(i * i for i in range(20_000))


def test_a_profile_whose_per_part_never_ran_prints_na(capsys):
    benchmarking = load_script()
    parts = [("test_benchmarking.py", "work", "the work"), ("nowhere.py", "forward", "forward")]
    benchmarking.profile(work, parts, per="forward", reps=2, what="a step without a forward")
    lines = capsys.readouterr().out.splitlines()
    by_label = {line.split("  ")[2].strip(): line for line in lines if line.startswith("    ")}
    assert by_label["the work"].split()[-1] == "n/a"
    assert float(by_label["the work"].split()[-3]) > 0  # its milliseconds are measured
    assert by_label["forward"].split()[-3:] == ["0.0", "0.0%", "n/a"]


def test_a_profile_per_a_part_that_ran_gives_its_ratio(capsys):
    benchmarking = load_script()
    parts = [("test_benchmarking.py", "work", "the work")]
    benchmarking.profile(work, parts, per="the work", reps=2, what="a step")
    lines = [line for line in capsys.readouterr().out.splitlines() if "the work" in line]
    assert lines[0].split()[-1] == "1.000"


def test_greedy_responses_must_match_raw_generate_exactly_in_float32_only():
    import numpy as np
    import torch

    spec = importlib.util.spec_from_file_location("bench_policy", SCRIPT.parent / "bench_policy.py")
    bench_policy = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))
    spec.loader.exec_module(bench_policy)

    class Response:
        def __init__(self, tokens):
            self.tokens = np.array(tokens)

    raw = torch.tensor([[5, 6, 2, 0], [7, 8, 9, 2], [3, 2, 0, 0]])  # EOS = 2, then padding
    same = [Response([5, 6, 2]), Response([7, 8, 9, 2]), Response([3, 2])]
    assert bench_policy.compare_greedy(raw, same, 2, exact=True) == (9, 3)
    flipped = [Response([5, 6, 2]), Response([7, 4, 9, 2]), Response([3, 2])]  # a near-tie
    assert bench_policy.compare_greedy(raw, flipped, 2, exact=False) == (9, 2)
    with pytest.raises(AssertionError, match="differ in float32"):
        bench_policy.compare_greedy(raw, flipped, 2, exact=True)
    longer = [Response([5, 6, 1, 1, 1, 2]), Response([7, 8, 9, 2]), Response([3, 2])]
    with pytest.raises(AssertionError, match="differ in length: 12 against 9 tokens"):
        bench_policy.compare_greedy(raw, longer, 2, exact=False)
