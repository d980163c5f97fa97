# ruff: noqa: E501  (data: one problem per line reads better than split strings)
"""A made-up GSM8K-format dataset (10 train, 3 test problems) for tests that need no real data.

The problems are invented, in GSM8K's format (worked answer, ``#### <number>``), with the
answer forms the reward parser must handle (thousands separators, decimals). They are written
once per test session to a temporary folder as ``train.jsonl`` / ``test.jsonl``, the file names
the GSM8K loader reads; ``FIXTURE`` is that folder. The real data is read from
``../shared/data/gsm8k`` and never copied into the repository.
"""

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

from llm_gym.envs import make_task_env, make_task_vector_env
from llm_gym.tasks import gsm8k_task

# LLMChat-GSM8K-v0 without gym.make's wrappers: the task's env, as DatasetChatEnv.
make_gsm8k_env = functools.partial(make_task_env, gsm8k_task)
make_gsm8k_vector_env = functools.partial(make_task_vector_env, task_factory=gsm8k_task)

__all__ = ["FIXTURE", "TEST", "TRAIN", "make_gsm8k_env", "make_gsm8k_vector_env"]

TRAIN = [
    {
        "question": "Tom has 3 boxes with 4 pencils in each box. How many pencils does Tom have?",
        "answer": "Tom has 3 * 4 = <<3*4=12>>12 pencils.\n#### 12",
    },
    {
        "question": "A baker makes 25 rolls and sells 17 of them. How many rolls are left?",
        "answer": "25 - 17 = <<25-17=8>>8 rolls are left.\n#### 8",
    },
    {
        "question": "Mia reads 12 pages a day for 5 days. How many pages does she read?",
        "answer": "She reads 12 * 5 = <<12*5=60>>60 pages.\n#### 60",
    },
    {
        "question": "A ticket costs $7. How much do 6 tickets cost?",
        "answer": "6 tickets cost 6 * 7 = $<<6*7=42>>42.\n#### 42",
    },
    {
        "question": "Sam had 50 marbles and gave away half. How many marbles does Sam have now?",
        "answer": "Sam gave away 50 / 2 = <<50/2=25>>25 marbles, so he has 50 - 25 = <<50-25=25>>25.\n#### 25",
    },
    {
        "question": "A farm has 9 cows and 14 sheep. How many animals are there?",
        "answer": "There are 9 + 14 = <<9+14=23>>23 animals.\n#### 23",
    },
    {
        "question": "Lena saves $15 a week. How much has she saved after 8 weeks?",
        "answer": "She saved 15 * 8 = $<<15*8=120>>120.\n#### 120",
    },
    {
        "question": "A rope is 36 meters long and is cut into 4 equal parts. How long is each part?",
        "answer": "Each part is 36 / 4 = <<36/4=9>>9 meters.\n#### 9",
    },
    {
        "question": "Ben buys 3 shirts at $12 each and a hat for $9. How much does he spend?",
        "answer": "Shirts cost 3 * 12 = $<<3*12=36>>36, so he spends 36 + 9 = $<<36+9=45>>45.\n#### 45",
    },
    {
        "question": "A class of 28 students splits into teams of 7. How many teams are there?",
        "answer": "There are 28 / 7 = <<28/7=4>>4 teams.\n#### 4",
    },
]

TEST = [
    {
        "question": "Janet’s hens lay 16 eggs a day. She uses 3 for breakfast and 4 for baking, and sells the rest for $2 each. How many dollars does she make a day?",
        "answer": "She sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs for 9 * 2 = $<<9*2=18>>18.\n#### 18",
    },
    {
        "question": "A shop sells 1,200 apples on Monday and 800 on Tuesday. How many apples did it sell?",
        "answer": "It sold 1200 + 800 = <<1200+800=2000>>2,000 apples.\n#### 2,000",
    },
    {
        "question": "Ana runs 2.5 km each day for 4 days. How many km does she run?",
        "answer": "She runs 2.5 * 4 = <<2.5*4=10>>10 km.\n#### 10",
    },
]


def _write() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="llm_gym_mini_gsm8k_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for split, split_rows in (("train", TRAIN), ("test", TEST)):
        lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in split_rows)
        (folder / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    return folder


FIXTURE = _write()
