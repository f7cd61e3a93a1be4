"""Talk to ``mtp-bindings serve`` with the official ``openai`` client.

The server speaks OpenAI's API, so any OpenAI client works unchanged: point its ``base_url`` at
the server. Run the server in one terminal (the bundled trained pair, MTP on)::

    pip install 'mtp-bindings[server]' openai
    mtp-bindings serve                      # http://127.0.0.1:8080, add --api-key KEY to require a key

and this script in another::

    python examples/openai_client.py        # or --base-url http://HOST:PORT/v1 --api-key KEY

It sends a chat completion, streams another, and sends a plain text completion, printing the
text and the server's llama-style ``timings`` (tokens/s, drafted and accepted tokens).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from openai import OpenAI


def describe_timings(timings: dict[str, Any] | None) -> str:
    """One line from the server's ``timings`` extension (not part of OpenAI's own schema)."""
    if not timings:
        return "(no timings)"
    line = f"{timings['predicted_n']} tokens at {timings['predicted_per_second']:.1f} tokens/s"
    if timings["draft_n"]:
        rate = timings["draft_n_accepted"] / timings["draft_n"]
        line += f", MTP accepted {timings['draft_n_accepted']}/{timings['draft_n']} drafts ({rate:.0%})"
    return line


def chat(client: OpenAI, model: str) -> None:
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Write a Python function that parses command line arguments."}],
        max_tokens=64,
        temperature=0,
    )
    print("--- chat ---")
    print(resp.choices[0].message.content)
    print(f"[{resp.choices[0].finish_reason}; {describe_timings((resp.model_extra or {}).get('timings'))}]")


def chat_stream(client: OpenAI, model: str) -> None:
    print("--- chat, streamed ---")
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=64,
        temperature=0,
        stream=True,
        extra_body={"speculative.n_max": 2},  # a llama-server extra: tokens drafted per round
    )
    timings = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        timings = (chunk.model_extra or {}).get("timings", timings)  # the last chunk carries them
    print(f"\n[{describe_timings(timings)}]")


def completion(client: OpenAI, model: str) -> None:
    resp = client.completions.create(model=model, prompt="def parse_args(argv):\n", max_tokens=64, temperature=0)
    print("--- completion ---")
    print(resp.choices[0].text)
    print(f"[{resp.usage.completion_tokens} tokens; {describe_timings((resp.model_extra or {}).get('timings'))}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"))
    ap.add_argument("--api-key", default=os.environ.get("MTP_API_KEY", "no-key"),
                    help="the server's --api-key, if it has one")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    model = client.models.list().data[0].id  # the server serves exactly one model
    print(f"model: {model}")
    chat(client, model)
    chat_stream(client, model)
    completion(client, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
