"""The ten-line agent of README and docs/agents.md: the official ``openai`` SDK, nothing of
llm_gym. ``llm-gym train --agent examples/check_agent.py:solve`` trains the model behind it."""

from openai import OpenAI


def solve(base_url, api_key, item):
    client = OpenAI(base_url=base_url, api_key=api_key)
    messages = list(item["messages"])
    for _ in range(2):  # answer, then look at the answer once more
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message, {"role": "user", "content": "Check it."}]
    return reply.choices[0].message.content
