"""``python -m llm_gym``: the ``llm-gym`` command."""

import sys

from llm_gym.cli import main

if __name__ == "__main__":
    sys.exit(main())
