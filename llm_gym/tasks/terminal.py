"""Terminal tasks a small model can learn: a seeded family of file chores in Harbor's format, in
levels from one command to several dependent ones (``LLMChat-Terminal-v0``'s default tasks)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llm_gym.tasks.harbor import TerminalTask

__all__ = ["TERMINAL_FAMILIES", "TERMINAL_LEVELS", "terminal_task"]

_WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "lemon",
          "comet", "eagle", "grape", "honey", "ivory", "jelly", "koala", "mango",
          "noble")  # fmt: skip
_NAMES = ("ada", "bo", "cy", "dee", "eli", "fay", "gus", "hal", "ivy", "jo", "kim", "lu")
_FILES = ("data", "notes", "log", "list", "items", "words", "input", "records")

Rng = np.random.Generator
# A family: rng -> (instruction, files, check, solve), the check a bash condition run in the
# workspace, the solve the oracle's commands.
Family = Callable[[Rng], tuple[str, dict[str, bytes], str, str]]
# The one-command chores' hints: at level 1 the command's shape, at level 0 the command itself.
# SmolLM2-135M-Instruct solved 0 of 32 without a hint (greedy and sampled) and 1 of 31 with the
# shape (greedy; 0 of 32 sampled): it learns to write what it is given in a block first.
_HINTS = {
    "create": "(`echo WORD > FILE` writes WORD into FILE.)",
    "copy": "(`cp FROM TO` copies a file.)",
    "rename": "(`mv FROM TO` renames a file.)",
    "count": "(`wc -l < FILE > count.txt` writes the number of lines of FILE into count.txt.)",
}


def _pick(rng: Rng, options: tuple[str, ...], k: int = 1) -> list[str]:
    return [str(x) for x in rng.choice(options, size=k, replace=False)]


def _lines(rng: Rng, n: int) -> list[str]:
    return _pick(rng, _WORDS, n)


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _same(path: str, lines: list[str]) -> str:
    # The file holds exactly these lines (a missing last newline forgiven).
    expected = "\\n".join(lines)
    return f'[ -f {path} ] && [ "$(cat {path})" = "$(printf "{expected}")" ]'


def _number(path: str, value: int) -> str:
    # The first number in the file is ``value`` (``wc -l data.txt`` writes "3 data.txt").
    return f'[ -f {path} ] && [ "$(grep -o "[0-9]\\+" {path} | head -1)" = "{value}" ]'


# -- level 0: one command -------------------------------------------------------------------------


def _create(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    name, word = _pick(rng, _FILES)[0], _pick(rng, _WORDS)[0]
    return (f"Create a file named {name}.txt that contains the word {word}.", {},
            f'grep -qw {word} {name}.txt', f"echo {word} > {name}.txt")  # fmt: skip


def _copy(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    src, dst = _pick(rng, _FILES, 2)
    lines = _lines(rng, 3)
    return (f"Copy the file {src}.txt to {dst}.txt.", {f"{src}.txt": _text(lines)},
            f"{_same(f'{dst}.txt', lines)} && [ -f {src}.txt ]",
            f"cp {src}.txt {dst}.txt")  # fmt: skip


def _rename(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    src, dst = _pick(rng, _FILES, 2)
    lines = _lines(rng, 2)
    return (f"Rename the file {src}.txt to {dst}.txt.", {f"{src}.txt": _text(lines)},
            f"{_same(f'{dst}.txt', lines)} && [ ! -e {src}.txt ]",
            f"mv {src}.txt {dst}.txt")  # fmt: skip


def _count(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    src = _pick(rng, _FILES)[0]
    lines = _lines(rng, int(rng.integers(3, 9)))
    return (f"Write the number of lines in {src}.txt into count.txt.", {f"{src}.txt": _text(lines)},
            _number("count.txt", len(lines)), f"wc -l < {src}.txt > count.txt")  # fmt: skip


# -- level 1: two steps, the second on the first's result -------------------------------------


def _sort(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    src = _pick(rng, _FILES)[0]
    lines = _lines(rng, 5)
    return (f"Sort the lines of {src}.txt alphabetically and write them into sorted.txt.",
            {f"{src}.txt": _text(lines)}, _same("sorted.txt", sorted(lines)),
            f"sort {src}.txt > sorted.txt")  # fmt: skip


def _folder(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    src, folder = _pick(rng, _FILES)[0], _pick(rng, ("backup", "archive", "saved", "old"))[0]
    lines = _lines(rng, 2)
    return (f"Create a folder named {folder} and copy {src}.txt into it.",
            {f"{src}.txt": _text(lines)}, _same(f"{folder}/{src}.txt", lines),
            f"mkdir -p {folder} && cp {src}.txt {folder}/")  # fmt: skip


def _find(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    names = _pick(rng, _FILES, 4)
    words = _lines(rng, 4 * 3)
    target = int(rng.integers(4))
    files = {f"notes/{n}.txt": _text(words[3 * i : 3 * i + 3]) for i, n in enumerate(names)}
    word = words[3 * target + int(rng.integers(3))]
    return (f"One of the files in the folder notes contains the word {word}. Write the name of "
            "that file into found.txt.", files, f"grep -q {names[target]} found.txt",
            f"grep -l {word} notes/* > found.txt")  # fmt: skip


def _matching(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    src, word = _pick(rng, _FILES)[0], _pick(rng, _WORDS)[0]
    lines = [f"{w} {word}" if rng.random() < 0.5 else w for w in _lines(rng, 6)]
    count = sum(word in line.split() for line in lines)
    return (f"Write the number of lines of {src}.txt that contain the word {word} into "
            "count.txt.", {f"{src}.txt": _text(lines)}, _number("count.txt", count),
            f"grep -c {word} {src}.txt > count.txt")  # fmt: skip


# -- level 2: several dependent commands ------------------------------------------------------


def _names(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    people = _pick(rng, _NAMES, 4)
    scores = [int(s) for s in rng.integers(10, 100, size=4)]
    table = ["name,score", *(f"{p},{s}" for p, s in zip(people, scores, strict=True))]
    return ("scores.csv starts with a header line (name,score). Write the names, one per line "
            "and without the header, into names.txt.", {"scores.csv": _text(table)},
            _same("names.txt", people),
            "tail -n +2 scores.csv | cut -d, -f1 > names.txt")  # fmt: skip


def _best(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    people = _pick(rng, _NAMES, 4)
    scores = [int(s) for s in rng.choice(np.arange(10, 100), size=4, replace=False)]
    table = ["name,score", *(f"{p},{s}" for p, s in zip(people, scores, strict=True))]
    best = people[int(np.argmax(scores))]
    return ("scores.csv starts with a header line (name,score). Write the name of the person "
            "with the highest score into best.txt.", {"scores.csv": _text(table)},
            f"grep -qw {best} best.txt && [ $(wc -w < best.txt) -eq 1 ]",
            "tail -n +2 scores.csv | sort -t, -k2 -n -r | head -1 | cut -d, -f1 "
            "> best.txt")  # fmt: skip


def _backup(rng: Rng) -> tuple[str, dict[str, bytes], str, str]:
    instruction, files, _, _ = _find(rng)
    word = instruction.split("the word ")[1].split(".")[0]
    target = next(name for name, data in files.items() if word in data.decode().split())
    base = target.split("/")[1]
    lines = files[target].decode().split()
    return (f"One of the files in the folder notes contains the word {word}. Create a folder "
            f"named backup, copy that file into it, and write its number of lines into "
            "count.txt.", files, f"{_same(f'backup/{base}', lines)} && {_number('count.txt', 3)}",
            f"mkdir -p backup && f=$(grep -l {word} notes/*) && cp $f backup/ && "
            "wc -l < $f > count.txt")  # fmt: skip


#: The families of each level: the level's chores, one drawn per task (levels 0 to 2: the
#: same one-command chores, with the command, with its shape, without a hint).
TERMINAL_FAMILIES: tuple[tuple[Family, ...], ...] = (
    (_create, _copy, _rename, _count),
    (_create, _copy, _rename, _count),
    (_create, _copy, _rename, _count),
    (_sort, _folder, _find, _matching),
    (_names, _best, _backup),
)
TERMINAL_LEVELS = len(TERMINAL_FAMILIES)


def terminal_task(seed: int, index: int, level: int) -> TerminalTask:
    """Task ``index`` of the stream ``seed`` at ``level`` (0: one command, given; 1: one
    command, its shape given; 2: one command; 3: two, the second on the first's result; 4:
    several), the same for the same arguments: its name says which.

    >>> task = terminal_task(0, 3, 0)
    >>> task.name
    'terminal-L0-s0-i3-rename'
    >>> print(task.instruction)
    Rename the file input.txt to records.txt. The command:
    ```bash
    mv input.txt records.txt
    ```
    >>> sorted(task.files), sorted(task.tests), sorted(task.solution)
    (['input.txt'], ['test.sh'], ['solve.sh'])
    """
    families = TERMINAL_FAMILIES[level]
    rng = np.random.default_rng([seed, index, level])
    family = families[int(rng.integers(len(families)))]
    instruction, files, check, solve = family(rng)
    if level == 0:
        instruction = f"{instruction} The command:\n```bash\n{solve}\n```"
    elif level == 1:
        instruction = f"{instruction} {_HINTS[family.__name__.lstrip('_')]}"
    test = (f"#!/bin/bash\ncd /app\nif {check}; then\n  echo 1 > /logs/verifier/reward.txt\n"
            "else\n  echo 0 > /logs/verifier/reward.txt\nfi\n")  # fmt: skip
    return TerminalTask(
        name=f"terminal-L{level}-s{seed}-i{index}-{family.__name__.lstrip('_')}",
        instruction=instruction,
        files=files,
        tests={"test.sh": test.encode()},
        solution={"solve.sh": f"#!/bin/bash\ncd /app\n{solve}\n".encode()},
        verifier_timeout=10.0,
    )
