"""Learning cards (issue 74): the default recipe's curve over four seeds on the main job's
task and on GuessTheNumber, written as ``llm_gym/run/learning_cards/NAME.json`` (what
``llm-gym profile --compare RUN_DIR`` holds a run against). A seed's run already finished in
its folder is read, not made again.

    python scripts/learning_cards.py chain_sum --seeds 0 1 2 3 --threads 1
    python scripts/learning_cards.py guess --seeds 0 1 2 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> (the command of one seed's run, with {seed} and {threads}; its run folder).
RUNS = {
    # The main job (README), less its checkpoint.
    "chain_sum": (
        "llm-gym train --env-arg task=chain_sum --eval-episodes 128 --seed {seed} "
        "--threads {threads} --no-progress --overwrite --out runs/learning/chain_sum/seed{seed}",
        "runs/learning/chain_sum/seed{seed}",
    ),
    # GRPO per episode on GuessTheNumber, as docs/forking.md measures it.
    "guess": (
        "python scripts/bench_turn_credit.py --task guess --credits episode --threads "
        "{threads} --seeds {seed}",
        "runs/turn-credit/guess/episode-seed{seed}",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(RUNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    from llm_gym.run.learning import learning_card

    template, folder = RUNS[args.name]
    runs = []
    for seed in args.seeds:
        run = ROOT / folder.format(seed=seed)
        if not (run / "summary.json").is_file():
            line = template.format(seed=seed, threads=args.threads)
            cli = shlex.split(line)
            cli = [sys.executable, "-m", "llm_gym", *cli[1:]] if cli[0] == "llm-gym" else [
                sys.executable, *cli[1:]]  # fmt: skip
            print(f"seed {seed}: {line}", flush=True)
            env = os.environ | {"HF_HUB_OFFLINE": "1"}
            subprocess.run(cli, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        runs.append(run)
    command = template.replace(" --threads {threads}", "").replace("--threads {threads} ", "")
    card = learning_card(runs, command.replace("{seed}", "SEED"))
    out = ROOT / "llm_gym" / "run" / "learning_cards" / f"{args.name}.json"
    out.write_text(json.dumps(card, indent=1) + "\n")
    mean = card["mean"]
    print(f"wrote {out.relative_to(ROOT)}: {len(mean)} iterations, {card['metric']} "
          f"{mean[0]:.3f} -> {mean[-1]:.3f} (mean of seeds {card['seeds']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
