#!/usr/bin/env bash
# The GPU check: on one CUDA GPU, offline, in at most --budget seconds (360), in this order:
# every CUDA test, the KL, policy and env benches in bfloat16, the update's memory and speed
# bench (bench_train_memory.py: the default SmolLM2-135M and a random SmolLM2-1.7B, llm_gym
# fp32 / bf16-mixed / LoRA 16 and TRL fp32 / bf16, 16 x 700 tokens), README's main job, and
# the bench on the 135M at 64 x 2048; print one table (step, status, seconds, key figures) and
# write it as JSON. Exit status 0 when every step passed.
#
#   bash scripts/gpu_check.sh [--dry-run] [--json PATH] [--budget SECONDS]
#
# --dry-run prints the commands without running them. The JSON goes to --json PATH, else
# $OUT/gpu_check.json where $OUT is set, else gpu_check.json in a temporary folder (printed);
# the steps' logs and the benches' JSON go beside it (gpu_check_logs/). Each step has its own
# timeout, cut to what is left of --budget; a failing or timed-out step is recorded and the
# next one runs; a step with under 15 s left is skipped. Python: the project's .venv where
# there is one, else python3 with the staged PYTHONPATH (/work/shared/gpu/stage.sh's export
# line); this tree's llm_gym comes first. GSM8K (the benches' questions): $LLM_GYM_GSM8K_PATH,
# .gpu/gsm8k, ../shared/data/gsm8k or $HOME/persist/gsm8k, else a stand-in of the test
# fixture's 3 questions repeated (recorded in the JSON). LoRA needs peft, the tests pytest.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DRY=0 JSON="" BUDGET=360
while (($#)); do
    case $1 in
        --dry-run) DRY=1 ;;
        --json) JSON=${2:?--json needs a path}; shift ;;
        --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
        -h|--help) awk 'NR > 1 { if (!/^#/) exit; print }' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (--dry-run, --json PATH, --budget S)" >&2; exit 2 ;;
    esac
    shift
done

if [[ -x .venv/bin/python ]]; then PY=$ROOT/.venv/bin/python; else PY=$(command -v python3); fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
if [[ -n $JSON ]]; then :
elif [[ -n ${OUT:-} ]]; then JSON=$OUT/gpu_check.json
else JSON=$WORK/gpu_check.json; fi
mkdir -p "$(dirname "$JSON")"
JSON=$(cd "$(dirname "$JSON")" && pwd)/$(basename "$JSON")
LOGS=$(dirname "$JSON")/gpu_check_logs
DEMO=$WORK/demo  # the main job's run folder (its checkpoint is 261 MB: not under $OUT)
cleanup() { rm -rf "$DEMO"; [[ $JSON == "$WORK"/* ]] || rm -rf "$WORK"; }
trap cleanup EXIT

# GSM8K for bench_kl, bench_policy and bench_env.
GSM8K="" GSM8K_NOTE="stand-in: tests/gsm8k_fixture.py's 3 test questions repeated"
for dir in "${LLM_GYM_GSM8K_PATH:-}" "$ROOT/.gpu/gsm8k" "$ROOT/../shared/data/gsm8k" \
    "$HOME/persist/gsm8k"; do
    if [[ -n $dir && -f $dir/test.jsonl ]]; then GSM8K=$(cd "$dir" && pwd) GSM8K_NOTE=$GSM8K; break; fi
done
STANDIN="import json, sys; sys.path.insert(0, 'tests'); from gsm8k_fixture import TEST
open('$WORK/gsm8k/test.jsonl', 'w').writelines(json.dumps(r) + '\n' for r in TEST * 86)"
if [[ -z $GSM8K ]]; then
    GSM8K=$WORK/gsm8k
    if ((DRY)); then echo "# GSM8K not found: a stand-in in $GSM8K"
    else mkdir -p "$GSM8K" && "$PY" -c "$STANDIN" || echo "gpu_check.sh: no GSM8K stand-in" >&2; fi
fi
export LLM_GYM_GSM8K_PATH=$GSM8K

# README's main job: its first bash block, without the set-up (the machine is staged), on CUDA,
# into its own folder.
LLM_GYM="$ROOT/.venv/bin/llm-gym"
[[ -x $LLM_GYM ]] || LLM_GYM="$PY -c 'import sys; from llm_gym.cli import main; sys.exit(main())'"
MAIN=$(awk '/^```bash/ {f = 1; next} f {print; exit}' README.md)
MAIN=${MAIN##*&& }
# Where README's first bash block is not a train command: the demo's train command itself.
if [[ $MAIN != .venv/bin/llm-gym\ train* ]]; then
    MAIN=".venv/bin/llm-gym train --env-arg task=chain_sum --eval-episodes 128 --save-every 20 --save-dtype bfloat16 --out runs/demo --overwrite"
fi
MAIN=$(sed -E "s#--out [^ ]+#--out $DEMO#" <<<"${MAIN/.venv\/bin\/llm-gym/$LLM_GYM}")
[[ $MAIN == *--device* ]] || MAIN="$MAIN --device cuda"

# The tests parametrized on (or named for) a CUDA device, in the files that mention CUDA.
TEST_FILES=$(grep -rl --include="test_*.py" cuda tests | sort | xargs)
BTM="$PY scripts/bench_train_memory.py --device cuda"
CASES="new,new@bf16-mixed,new-lora16,trl,trl-bf16"

NAMES=() TIMEOUTS=() COMMANDS=()
step() { NAMES+=("$1"); TIMEOUTS+=("$2"); COMMANDS+=("$3"); }
step gpu 30 "$PY -c 'import sys, torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else \"NO CUDA DEVICE\"); sys.exit(not torch.cuda.is_available())'"
step tests 75 "$PY -m pytest -q -m '' -k cuda -p no:cacheprovider ${TEST_FILES:-tests/}"
step bench_kl 50 "$PY scripts/bench_kl.py --device cuda --dtype bfloat16 --num-envs 32 --rounds 3 --max-new-tokens 32 --no-install"
step bench_policy 40 "$PY scripts/bench_policy.py --device cuda --dtype bfloat16 --n 16 --rounds 3 --max-new-tokens 32"
step bench_env 40 "$PY scripts/bench_env.py --device cuda --dtype bfloat16 --num-envs 128 --turns 256 --torchrl-turns 32 --repeats 3 --no-install"
step train_memory_135m 80 "$BTM --model default --sequences 16 --seq-len 700 --cases $CASES --timeout 60 --json $LOGS/train_memory_135m.json"
step train_memory_1.7b 120 "$BTM --model SmolLM2-1.7B --sequences 16 --seq-len 700 --cases $CASES --timeout 60 --json $LOGS/train_memory_1.7b.json"
step main_job 120 "$MAIN"
step train_memory_135m_64x2048 90 "$BTM --model default --sequences 64 --seq-len 2048 --cases $CASES --timeout 60 --json $LOGS/train_memory_135m_64x2048.json"

if ((DRY)); then
    echo "# gpu_check.sh --dry-run: python $PY; GSM8K $GSM8K_NOTE; JSON $JSON; budget ${BUDGET} s"
    for i in "${!NAMES[@]}"; do
        echo "[${NAMES[$i]}] timeout ${TIMEOUTS[$i]} s: ${COMMANDS[$i]}"
    done
    rm -rf "$WORK"
    exit 0
fi

mkdir -p "$LOGS"
RECORD=$WORK/steps.tsv
: >"$RECORD"
START=$SECONDS
for i in "${!NAMES[@]}"; do
    name=${NAMES[$i]} limit=${TIMEOUTS[$i]} command=${COMMANDS[$i]}
    left=$((BUDGET - (SECONDS - START)))
    ((limit > left)) && limit=$left
    if ((limit < 15)); then
        printf '%s\tskipped\t0\t%s\t%s\n' "$name" "$LOGS/$name.log" "$command" >>"$RECORD"
        echo "== $name: skipped, ${left} s of the budget left"
        continue
    fi
    echo "== $name (timeout $limit s): $command"
    began=$SECONDS
    timeout -k 10 "$limit" bash -c "$command" >"$LOGS/$name.log" 2>&1
    rc=$?
    seconds=$((SECONDS - began))
    case $rc in
        0) status=ok ;;
        124|137) status="timeout ${limit}s" ;;
        *) status="failed rc $rc" ;;
    esac
    tail -n 3 "$LOGS/$name.log" | sed 's/^/   /'
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "$LOGS/$name.log" "$command" >>"$RECORD"
done
[[ -f $DEMO/summary.json ]] && cp "$DEMO/summary.json" "$LOGS/main_job_summary.json"

"$PY" - "$RECORD" "$JSON" "$LOGS" "$GSM8K_NOTE" "$((SECONDS - START))" <<'EOF'
"""The table and the JSON: each step's status, seconds and key figures (read from its log)."""
import json
import re
import sys
from pathlib import Path

record, out, logs, gsm8k, total = sys.argv[1:6]


def lines(text, pattern):
    return [m.group(0).strip() for m in re.finditer(pattern, text, re.M)]


def figures(name, text):
    if name == "gpu":
        return lines(text, r"^torch .*$")[-1:]
    if name == "tests":
        return lines(text, r"^.*\b(passed|failed|skipped|error|deselected)\b.* in [\d.]+s.*$")[-1:]
    if name == "bench_kl":  # the ratio rows: key, wall ratio, target, met (SmolLM2's first)
        pattern = r"^  (\S+/\S+) .*? ([\d.]+x?) +[\d.]+x? +([<>]=) *([\d.]+x?) +(yes|NO)$"
        seen = {}
        for key, wall, op, target, met in re.findall(pattern, text, re.M):
            seen.setdefault(key, f"{key} {wall} ({op} {target} {met})")
        return list(seen.values())
    if name == "bench_policy":
        return lines(text, r"^(generate throughput \(wall\)|log-prob time ratio \(wall\)).*$")
    if name == "bench_env":
        return lines(text, r"^\w+ +vector \d+ .*$")
    if name == "main_job":
        summary = Path(logs) / "main_job_summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            return [f"success {s['before']['success']:.3f} -> {s['after']['success']:.3f}, "
                    f"{s['iterations']} iterations, {s['minutes_this_run']:.1f} min, "
                    f"device {s.get('device')}"]
        return lines(text, r"^.*(Error|error).*$")[-1:]
    if name.startswith("train_memory"):
        path = Path(logs) / f"{name}.json"
        if not path.is_file():
            return lines(text, r"^.*(Error|FAILED).*$")[-2:]
        cases = []
        for r in json.loads(path.read_text())["results"]:
            if "error" in r:
                cases.append(f"{r['case']} FAILED {r['error'][:80]}")
                continue
            mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
            cases.append(f"{r['case']} {r['peak'] / 1e9:.1f} GB {r['update_s']:.2f} s "
                         f"{r['tokens_per_s']:.0f} tok/s MFU {mfu}")
        return cases
    return []


steps = []
for row in Path(record).read_text().splitlines():
    name, status, seconds, log, command = row.split("\t", 4)
    text = Path(log).read_text(errors="replace") if Path(log).is_file() else ""
    steps.append({"step": name, "status": status, "seconds": int(seconds), "command": command,
                  "log": log, "figures": figures(name, text) if status != "skipped" else [],
                  "error": (lines(text, r"^\w*(Error|Exception)\b.*$") or [None])[-1]
                  if status.startswith("failed") else None,
                  "tail": text.strip().splitlines()[-5:]})
print(f"\n{'step':<26} {'status':<14} {'s':>5}  key figures")
for s in steps:
    first, *rest = s["figures"] or [s["error"] or ""]
    print(f"{s['step']:<26} {s['status']:<14} {s['seconds']:>5}  {first}")
    for more in rest:
        print(f"{'':<48}{more}")
print(f"total {total} s; GSM8K: {gsm8k}; JSON: {out}")
Path(out).write_text(json.dumps({"seconds": int(total), "gsm8k": gsm8k, "steps": steps},
                                indent=2) + "\n")
sys.exit(0 if all(s["status"] == "ok" for s in steps) else 1)
EOF
