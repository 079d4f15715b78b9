"""A mixed LLM load in Locust: 70% short chat, 20% code, 10% long documents.

Think time and the mix are Locust's own (``wait_time``, ``@task`` weights); every request is
captured by latency_analyzer and comes back as a waterfall::

    pip install 'latency-analyzer[locust]'
    locust -f examples/locustfile_mixed.py --host http://127.0.0.1:8000 \\
        --headless -u 50 -r 10 -t 5m --csv mixed --la-out mixed.jsonl
    latency-analyzer compare before.jsonl mixed.jsonl --metric ttft_p50

Locust's statistics gain ``TTFT``, ``TPOT`` and ``STAGE`` rows (``short_chat ttft`` ...), the
web UI a Latency tab and the ``/latency`` page; ``WaterfallSet.load("mixed.jsonl")`` reads
every request (``group_by("template")`` splits the three kinds).
"""

from __future__ import annotations

import os

from locust import between, task

from latency_analyzer.load import synthetic_prompt
from latency_analyzer.locust import OpenAIUser

_DOCUMENT = synthetic_prompt(4000, 1)  # a long input: prefill dominates its TTFT


class MixedUser(OpenAIUser):
    """One person at a chat assistant: reads, thinks, asks again."""

    wait_time = between(1, 3)
    model = os.environ.get("LA_MODEL", "default")
    api_key = os.environ.get("OPENAI_API_KEY")  # sent as a header, never recorded

    @task(70)
    def short_chat(self) -> None:
        self.chat("What is the capital of France? One word.", name="short_chat", max_tokens=16)

    @task(20)
    def code(self) -> None:
        prompt = "Write a Python function that merges two sorted lists, with a docstring."
        self.chat(prompt, name="code", max_tokens=256)

    @task(10)
    def long_document(self) -> None:
        messages = [
            {"role": "system", "content": "Summarise the document in three sentences."},
            {"role": "user", "content": _DOCUMENT},
        ]
        self.chat(messages, name="long_document", max_tokens=128)
