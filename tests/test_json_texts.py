"""``core.json_texts``, the export's decoder of stored JSON a column at a time: what ``json.loads`` reads of each
text, and its errors."""

from __future__ import annotations

import json
import math

import pytest

from llm_dispatch.core import json_texts


def test_each_text_is_what_json_loads_reads() -> None:
    texts = ['[{"role": "user", "content": "naïve \\u00e9"}]', None, '{"a": 1, "b": [true, null, 2.5]}', '"x"', "17",
             '  {"spaced": 1}  ', "NaN", "1e400"]

    read = json_texts(texts)

    assert read[:-2] == [None if text is None else json.loads(text) for text in texts][:-2]
    assert math.isnan(read[-2]) and read[-1] == math.inf
    assert json_texts([]) == [] and json_texts([None, None]) == [None, None]


@pytest.mark.parametrize("bad", ["", "[1, 2", "1 2", "{} x", "nope"])
def test_a_text_that_is_not_json_raises_as_json_loads_does(bad: str) -> None:
    with pytest.raises(json.JSONDecodeError) as raised:
        json_texts(['{"fine": true}', bad])
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(bad)
    assert str(raised.value) == str(expected.value)
