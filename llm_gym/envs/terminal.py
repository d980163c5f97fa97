"""``TerminalEnv``: a shell in a sandbox with a workspace of its own, on Harbor's tasks."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gymnasium.vector import SyncVectorEnv

from llm_gym.chat.history import History
from llm_gym.checks import check_bool, check_int, check_number
from llm_gym.envs.chat import ActionRead, Outcome
from llm_gym.envs.dataset import DatasetChatEnv
from llm_gym.envs.sharded import sharded_vector_env
from llm_gym.sources import ProceduralSource
from llm_gym.tasks.harbor import TerminalTask, load_harbor_tasks, verifier_reward
from llm_gym.tasks.terminal import TERMINAL_LEVELS, terminal_task
from llm_gym.tools.base import Tool, ToolError
from llm_gym.tools.shell import Shell, bash_tool

if TYPE_CHECKING:
    from llm_gym.chat.conversation import Conversation
    from llm_gym.rubrics import TaskScore
    from llm_gym.tools.toolbox import ToolRecord

__all__ = ["TERMINAL_ID", "TERMINAL_REQUEST", "TerminalEnv", "make_terminal_vector_env"]

TERMINAL_ID = "LLMChat-Terminal-v0"
# SmolLM2-135M-Instruct answers a request in the user's own message, not a system prompt's
# tool block (the Products task's finding): the instruction ends with how to run commands.
TERMINAL_REQUEST = (
    "You are in the folder {workdir}. Write the shell command in a ```bash code block. When "
    "the task is done, reply without a code block."
)
_VERIFIER = {"/tests": 16, "/logs/verifier": 1, "/solution": 16}  # folders and MiB


class TerminalEnv(DatasetChatEnv):
    """A terminal task: the policy runs shell commands in the episode's own sandboxed
    workspace until it says it is done, then the task's tests score the workspace.

    ## Description

    Each episode is one task in Harbor's format (``llm_gym.tasks.harbor``): its instruction
    is the prompt, its workspace (the Dockerfile's ``WORKDIR``, ``/app`` by default, with the
    files its ``COPY`` lines name) appears in a bubblewrap sandbox at ``reset`` and lives to
    the end of the episode. The policy's ``bash`` calls (```` ```bash ```` blocks in the
    default markdown format, or hermes ``<tool_call>``s) run there one after another, each
    seeing the files of the calls before it (``llm_gym.tools.Shell``: each call with its
    timeout, as ``nobody``, without network, what it leaves running killed when it ends).
    After the last turn the task's ``tests/test.sh`` runs in the same sandbox, with the
    tests at ``/tests`` (put there only then) and ``/logs/verifier`` writable, and its
    ``reward.txt`` or ``reward.json`` is the reward. Without ``tasks`` the episodes are
    ``llm_gym.tasks.terminal``'s seeded file chores, in levels.

    ## Action Space

    As ``ChatEnv``: a ``str`` (or token ids in ``"tokens"`` mode), or a ``Response``.

    ## Observation Space

    As ``ChatEnv``: the conversation as ``history``, ``text`` and/or ``tokens`` (and
    ``policy_mask``, 1 on the policy's tokens only: a command's output is never trained on).

    ## Rewards

    0 for a turn with calls, plus ``tool_error_reward`` for each that failed (a status other
    than 0, killed at its timeout, or processes left running). The last turn adds the
    verifier's reward (Harbor's reading: ``reward.json``'s ``"reward"`` or the mean of its
    numbers, else ``reward.txt``'s number; none, or a ``test.sh`` past ``[verifier]
    timeout_sec``, scores 0 with ``verifier_note`` in ``info``). The last ``info`` has
    ``success`` (the verifier's reward is 1 or more), ``task``, ``verifier_rewards`` and
    ``verifier_seconds``.

    ## Starting State

    ``[system_prompt?, the instruction + TERMINAL_REQUEST]`` of the next task of a seeded
    order (Harbor folders: each task once an epoch; the family: a seeded stream), or of
    ``options={"item": {"task": name}}`` (a loaded task's name); the reset ``info`` holds
    ``task`` (and the family's ``level``).

    ## Episode End

    Terminated by a turn without a call (the answer); truncated when a turn's calls go past
    ``max_tool_calls`` or at ``max_turns``. Either way the verifier runs and the sandbox,
    its workspace and every process in it are gone after the last step.

    ## Arguments

    - ``tasks``: a Harbor task folder, a folder of them, or ``TerminalTask``s; None (default)
      for the seeded family at ``level``. Every task is checked when the env is made: a
      Dockerfile that needs an image built is refused by name and line.
    - ``level``: the family's level, 0 (default) to 4 (``TERMINAL_LEVELS``; the curriculum
      moves it); not with ``tasks``.
    - ``command_timeout``: seconds a call may run (default 10); ``max_workspace_mb``: the
      workspace's size (default 32; ``/tmp`` has 16).
    - ``ask_for_commands``: end the instruction with ``TERMINAL_REQUEST`` (default True).
    - ``tool_format``: ``"markdown"`` (default) or ``"hermes"``; ``tools``: more tools beside
      ``bash`` (``"python"``); ``max_tool_calls`` (default 8), ``tool_error_reward``.
    - ``seed``, ``repeats``, ``group_repeats``, ``shard``, ``system_prompt``, ``max_turns``
      and ``**chat_options``: as ``DatasetChatEnv``'s.

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-Terminal-v0", level=0)
    >>> obs, info = env.reset(seed=0)
    >>> info["task"], env.unwrapped.instruction[:54]
    ('terminal-L0-s0-i0-count', 'Write the number of lines in words.txt into count.txt.')
    >>> obs, reward, terminated, truncated, info = env.step("```bash\\nls\\n```")
    >>> obs["history"][-1]["content"]
    'words.txt\\n'
    >>> obs, *_ = env.step("```bash\\nwc -l words.txt > count.txt\\ncat count.txt\\n```")
    >>> obs["history"][-1]["content"]
    '6 words.txt\\n'
    >>> obs, reward, terminated, truncated, info = env.step("Done.")
    >>> reward, terminated, info["success"]
    (1.0, True, True)
    """

    shares_conversations = False  # the workspace is the episode's own: no DatasetChatVectorEnv
    rescorable = False  # the reward is the workspace's state after the play, not the text's

    def __init__(
        self,
        tasks: str | Path | Sequence[TerminalTask] | None = None,
        *,
        level: int | None = None,
        command_timeout: float = 10.0,
        max_workspace_mb: int = 32,
        ask_for_commands: bool = True,
        tool_format: str = "markdown",
        tools: Sequence[Any] | None = None,
        max_tool_calls: int = 8,
        max_turns: int | None = None,
        **options: object,
    ) -> None:
        self.command_timeout = check_number("command_timeout", command_timeout, low=0, strict=True)
        self.max_workspace_mb = check_int("max_workspace_mb", max_workspace_mb, low=1)
        self.ask_for_commands = check_bool("ask_for_commands", ask_for_commands)
        check_int("level", level, low=0, optional=True)
        if tasks is not None and level is not None:
            raise ValueError(
                f"level={level} picks a level of the seeded family; tasks= loads Harbor tasks, "
                "which have none: pass one of them"
            )
        if tasks is None:
            level = 0 if level is None else level
            if level >= TERMINAL_LEVELS:
                raise ValueError(f"level must be 0 to {TERMINAL_LEVELS - 1}, got {level}")
            self.tasks: dict[str, TerminalTask] = {}
            source = ProceduralSource(_family_item, num_levels=TERMINAL_LEVELS, level=level)
            dataset: Any = source
        else:
            loaded = _load(tasks)
            self.tasks = {task.name: task for task in loaded}
            dataset = [{"query": task.instruction, "task": task.name} for task in loaded]
        self._shell: Shell | None = None
        self._task: TerminalTask | None = None
        super().__init__(
            dataset, tools=[self._bash_tool(), *(tools or [])], tool_format=tool_format,
            max_tool_calls=max_tool_calls, max_turns=max_turns, **options,
        )  # fmt: skip

    @property
    def task_spec(self) -> TerminalTask | None:
        """The episode's task (None before the first reset)."""
        return self._task

    @property
    def instruction(self) -> str | None:
        """The episode's task's instruction, as its folder has it."""
        return None if self._task is None else self._task.instruction

    @property
    def shell(self) -> Shell | None:
        """The episode's sandbox (None before the first reset; closed after the episode)."""
        return self._shell

    def episode_start(self, item: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        """Open the sandbox with ``item``'s task's workspace; its instruction as the prompt."""
        task = self._task_of(item)
        self._close_shell()
        self._shell = Shell(
            workdir=task.workdir, timeout=self.command_timeout, env=task.env,
            max_workspace_mb=self.max_workspace_mb, writable=_VERIFIER,
        ).start(task.files)  # fmt: skip
        self._task = task
        query = task.instruction
        if self.ask_for_commands:
            query = f"{query}\n\n{TERMINAL_REQUEST.format(workdir=task.workdir)}"
        info = {key: value for key, value in item.items() if key != "query"}
        return self._history_for(query), info

    def given_item(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``options={"item": {"task": name}}``: a loaded task, or the family's task of
        ``{"task_seed", "task_index", "level"}``; checked before anything changes."""
        if options and isinstance(options.get("item"), Mapping):
            item = dict(options["item"])
            task = self._task_of(item)  # raises for a name not loaded
            options = {**options, "item": {"query": task.instruction, **item}}
        return super().given_item(options)

    def _task_of(self, item: Mapping[str, Any]) -> TerminalTask:
        if "task_seed" in item:  # the family's: made again from its seed
            return terminal_task(
                int(item["task_seed"]), int(item["task_index"]), int(item["level"])
            )
        name = item.get("task")
        if name not in self.tasks:
            raise ValueError(
                f"item's task must be one of the loaded tasks {sorted(self.tasks)[:8]}, got "
                f"{name!r}"
            )
        return self.tasks[name]

    # -- a step ---------------------------------------------------------------------------------

    def _score(
        self, response: str, item: Mapping[str, Any] | None
    ) -> tuple[float, bool, dict[str, Any]]:
        return self.verify()

    def advance(
        self, conversation: Conversation, read: ActionRead, records: Sequence[ToolRecord],
        item: Mapping[str, Any] | None = None, score: TaskScore | None = None,
    ) -> Outcome:  # fmt: skip
        """``ChatEnv.advance``; an episode cut by the limits is verified too (``verify``)."""
        outcome = super().advance(conversation, read, records, item, score)
        if outcome.truncated and not outcome.terminated:
            reward, _, info = self.verify()
            outcome = outcome._replace(
                reward=outcome.reward + reward, info={**outcome.info, **info}
            )
        return outcome

    def verify(self) -> tuple[float, bool, dict[str, Any]]:
        """Run the task's tests on the workspace (``/tests/test.sh``, within ``[verifier]
        timeout_sec``), then end the sandbox: the reward, True, the info."""
        task, shell = self._task, self._shell
        if shell is None or task is None:
            return 0.0, True, {"success": False, "verifier_note": "no sandbox to verify"}
        if not shell.alive and not shell.pending:  # a call ended it: the task's files again
            shell.start(task.files)
        shell.put("/tests", task.tests)
        shell.put("/logs/verifier", {})
        run = shell.run("bash /tests/test.sh", timeout=task.verifier_timeout, cwd=task.workdir)
        reward, info = verifier_reward(
            shell.read("/logs/verifier/reward.txt"), shell.read("/logs/verifier/reward.json")
        )
        if run.timed_out:
            limit = task.verifier_timeout
            reward, info = 0.0, {"verifier_note": f"tests/test.sh ran past the task's {limit:g} "
                                 "s ([verifier] timeout_sec) and was killed: reward 0"}  # fmt: skip
        self._close_shell()  # the workspace and everything in it end with the episode
        info.update(success=reward >= 1.0, task=task.name, verifier_seconds=run.seconds)
        info["reward_version"] = task.reward_version
        return reward, True, info

    def oracle_action(self) -> str:
        """The turn that plays the task's ``solution/solve.sh`` (put at ``/solution`` now), in
        the env's tool format: what ``llm-gym check-tasks`` sends as the policy."""
        if self._shell is None or self._task is None:
            raise RuntimeError("oracle_action() needs a reset first")
        if not self._task.solution:
            raise ValueError(f"task {self._task.name!r} has no solution/solve.sh")
        self._shell.put("/solution", self._task.solution)
        command = "bash /solution/solve.sh"
        if self.toolbox.tool_format == "markdown":
            return f"```bash\n{command}\n```"
        call = json.dumps({"name": "bash", "arguments": {"command": command}})
        return f"<tool_call>{call}</tool_call>"

    # -- the sandbox's life ------------------------------------------------------------------------

    def fork(self) -> TerminalEnv:
        """``DatasetChatEnv.fork``, with a sandbox of its own holding a copy of the workspace
        (and ``/tmp``): a file written before the fork is in both, one written after in one."""
        other = super().fork()
        other._shell = None if self._shell is None else self._shell.fork()
        other.toolbox = copy.copy(self.toolbox)
        other.toolbox.tools = {**self.toolbox.tools, "bash": other._bash_tool()}
        return other

    def close(self) -> None:
        """End the sandbox (and the tools' servers)."""
        self._close_shell()
        super().close()

    def _close_shell(self) -> None:
        if self._shell is not None:
            self._shell.close()
            self._shell = None

    def _bash_tool(self) -> Tool:
        # The tool the toolbox runs: this env's current sandbox, whichever episode it is.
        return bash_tool(self._bash)

    def _bash(self, command: str) -> str:
        if self._shell is None:
            raise ToolError("Error: the episode has no sandbox (it has ended)")
        return self._shell.call(command)


def _family_item(seed: int, index: int, level: int) -> dict[str, Any]:
    task = terminal_task(seed, index, level)
    return {"query": task.instruction, "task": task.name, "task_seed": seed, "task_index": index,
            "level": level}  # fmt: skip


def _load(tasks: Any) -> list[TerminalTask]:
    if isinstance(tasks, (str, Path)):
        return load_harbor_tasks(tasks)
    if isinstance(tasks, Sequence) and tasks and all(isinstance(t, TerminalTask) for t in tasks):
        names = [t.name for t in tasks]
        if len(set(names)) < len(names):
            raise ValueError(f"tasks must have distinct names, got {names}")
        return list(tasks)
    raise TypeError(
        "tasks must be a Harbor task folder, a folder of them or a list of TerminalTask, got "
        f"{tasks!r:.80}"
    )


def make_terminal_vector_env(
    num_envs: int = 1, shards: tuple[int, int] | None = None, **kwargs: object
) -> SyncVectorEnv:
    """The ``vector_entry_point`` of ``LLMChat-Terminal-v0``: ``num_envs`` sandboxes side by
    side, one ``TerminalEnv`` each on one shard of the tasks (``sharded_vector_env``, with
    its ``shards``).

    >>> envs = make_terminal_vector_env(2, level=0)
    >>> obs, infos = envs.reset(seed=0)
    >>> [env.unwrapped.shell.workdir for env in envs.envs]
    ['/app', '/app']
    >>> envs.close()
    """
    return sharded_vector_env(TERMINAL_ID, num_envs, shards, **kwargs)
