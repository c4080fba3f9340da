"""Both offline token counters against what OpenAI really counts: the client's estimate, which feeds
cost previews and the TPM limiter, and the simulator's counter, which it reports as ``usage``.

Every EXACT figure is the text's o200k_base count (the tokenizer of gpt-4o and later), computed once
outside the project with the exact offline tokenizer in the bpe-openai package:

    pip install bpe-openai
    python -c "import bpe_openai; print(len(bpe_openai.get_encoding('o200k_base').encode_ordinary(TEXT)))"

Chat figures add OpenAI's framing: 3 tokens a message plus its role (1 token), 3 to prime the reply.
``bench/tokens.py`` measures the same over ~1,900 texts; these few keep the figures from drifting.
"""

from __future__ import annotations

import json
import random

import pytest

from llm_dispatch.simulator import count_message_tokens, count_tokens
from llm_dispatch.core import ChatRequest
from llm_dispatch.core.pricing._tokens import estimate_input_tokens, estimate_prompt_tokens, estimate_text_tokens, input_tokens_at_most

PROSE = (
    "Most of the town's water comes from a reservoir in the hills, built in the 1930s when the old wells "
    "ran dry. It holds enough for about six months, but two dry summers in a row have left it at a third "
    "of its capacity, and the council has asked households to avoid watering gardens until the autumn rains."
)
PROSE_EXACT = 68
INSTRUCTIONS = (
    "You are a support assistant for an online bookshop. Answer in two or three sentences, "
    "in a friendly tone. If the customer asks about an order, ask for the order number first. "
    "Never promise a delivery date, and offer to pass the conversation to a colleague if you cannot help."
)
INSTRUCTIONS_EXACT = 58
NOTICE = (
    "The committee met on Tuesday to review the proposal for a new public library. After a long "
    "discussion about costs, location and opening hours, the members agreed to ask the city for "
    "additional funding and to publish a detailed plan before the end of the year."
)
NOTICE_EXACT = 50
CODE = (
    "def moving_average(values: list[float], window: int = 3) -> list[float]:\n"
    '    """Average of each run of `window` consecutive values."""\n'
    "    if window <= 0:\n"
    '        raise ValueError(f"window must be positive, got {window}")\n'
    "    return [sum(values[i : i + window]) / window for i in range(len(values) - window + 1)]\n"
)
CODE_EXACT = 82
ORDER = json.dumps(
    {
        "order_id": "A-10293",
        "customer": {"name": "Ada Lovelace", "email": "ada@example.com"},
        "items": [
            {"sku": "BK-001", "title": "Notes on the Analytical Engine", "qty": 2, "price": 12.5},
            {"sku": "BK-017", "title": "Sketch of the Analytical Engine", "qty": 1, "price": 9.99},
        ],
        "shipping": {"method": "standard", "country": "GB"},
    }
)
ORDER_EXACT = 112
JAPANESE = "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。毎年多くの観光客が訪れます。"
JAPANESE_EXACT = 38
CHINESE = "北京是中华人民共和国的首都，也是全国的政治和文化中心。"
CHINESE_EXACT = 14
RUSSIAN = "Москва — столица России и крупнейший город страны по численности населения."
RUSSIAN_EXACT = 16
CHAT = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": NOTICE}]
CHAT_EXACT = 3 + (3 + 1 + INSTRUCTIONS_EXACT) + (3 + 1 + NOTICE_EXACT)  # 119

ENGLISH = [(PROSE, PROSE_EXACT), (INSTRUCTIONS, INSTRUCTIONS_EXACT), (NOTICE, NOTICE_EXACT)]


def off_by(estimate: int, exact: int) -> float:
    return abs(estimate - exact) / exact


# --- the client's estimate ----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "exact"), ENGLISH)
def test_english_prose_and_instructions_are_estimated_within_8_percent(text: str, exact: int) -> None:
    assert off_by(estimate_text_tokens(text), exact) <= 0.08


def test_a_batch_of_english_prompts_is_estimated_within_3_percent() -> None:
    # What a cost preview adds up; the mean of chars/4 and words/0.75 used before came to +19%.
    estimate = sum(estimate_text_tokens(text) for text, _ in ENGLISH)
    assert off_by(estimate, sum(exact for _, exact in ENGLISH)) <= 0.03


@pytest.mark.parametrize(("text", "exact"), [(CODE, CODE_EXACT), (ORDER, ORDER_EXACT)])
def test_code_and_json_are_estimated_within_10_percent(text: str, exact: int) -> None:
    # The rule before undercounted dense JSON by 40%, letting a TPM budget overrun.
    assert off_by(estimate_text_tokens(text), exact) <= 0.10


@pytest.mark.parametrize(
    ("text", "exact"), [(JAPANESE, JAPANESE_EXACT), (CHINESE, CHINESE_EXACT), (RUSSIAN, RUSSIAN_EXACT)]
)
def test_other_scripts_are_not_underestimated_wildly(text: str, exact: int) -> None:
    # The rule before put the Japanese at a fifth of its real count; common phrases may be overestimated.
    assert 0.8 * exact <= estimate_text_tokens(text) <= 1.6 * exact


def test_empty_text_costs_nothing_and_any_other_text_at_least_one_token() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens(" ") == 1
    assert estimate_text_tokens("a") == 1
    assert estimate_text_tokens("\ud800 broken surrogate from a JSON escape") > 0


def test_chat_prompt_estimate_counts_the_framing_and_roles() -> None:
    assert off_by(estimate_prompt_tokens(CHAT), CHAT_EXACT) <= 0.05
    # A one-word message is mostly framing: 3 + role + "Hi" + 3 to prime the reply.
    assert estimate_prompt_tokens([{"role": "user", "content": "Hi"}]) == 8


# --- the simulator's counter ----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "exact"), ENGLISH + [(CODE, CODE_EXACT), (ORDER, ORDER_EXACT)])
def test_simulator_counts_english_code_and_json_within_5_percent(text: str, exact: int) -> None:
    assert off_by(count_tokens(text), exact) <= 0.05


def test_simulator_reports_chat_usage_as_openai_would() -> None:
    assert off_by(count_message_tokens(CHAT), CHAT_EXACT) <= 0.03
    assert count_message_tokens([{"role": "user", "content": "Hi"}]) == 8  # as OpenAI bills it


@pytest.mark.parametrize(("text", "exact"), [(JAPANESE, JAPANESE_EXACT), (CHINESE, CHINESE_EXACT)])
def test_simulator_counts_cjk_in_the_right_range(text: str, exact: int) -> None:
    assert 0.8 * exact <= count_tokens(text) <= 1.5 * exact


def test_the_bound_from_lengths_is_never_below_the_estimate() -> None:
    # The characters each term of the estimate weighs most: word starts, digits, symbols, newlines, every script.
    pool = [" a", "a", "7", "{", "\n", "é", "ж", "中", "한", "😀", "\ud800", " ", "\t"]
    rng = random.Random(11)
    for _ in range(2000):
        texts = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 60))) for _ in range(rng.randint(1, 3))]
        request = ChatRequest(model="m", messages=[{"role": "user", "content": text} for text in texts])
        at_most = input_tokens_at_most(request)
        assert at_most is not None and estimate_input_tokens(request) <= at_most, texts


def test_no_bound_is_given_where_the_estimate_reads_more_than_text() -> None:
    text = [{"role": "user", "content": "hi"}]
    assert input_tokens_at_most(ChatRequest(model="m", messages=text, params={"tools": [{"type": "function"}]})) is None
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert input_tokens_at_most(ChatRequest(model="m", messages=parts)) is None
