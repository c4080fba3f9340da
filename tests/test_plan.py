"""How a real-time run is cut into chunk tasks as jobs grow."""

from __future__ import annotations

import math

import pytest

from llm_dispatch.jobs._plan import MAX_CHUNKS_PER_RUN, chunk_size_for


@pytest.mark.parametrize(("requests", "size", "chunks"), [
    (10_000, 1_000, 10),          # the configured size
    (25_000, 1_000, 25),
    (100_000, 4_000, 25),         # grown to stay at MAX_CHUNKS_PER_RUN task runs
    (1_000_000, 5_000, 200),      # grown no further: a chunk's rows are in memory while it is sent
    (10_000_000, 5_000, 2_000),
])
def test_chunks_grow_with_the_job_to_a_size_that_then_holds(requests: int, size: int, chunks: int) -> None:
    assert chunk_size_for(requests, chunk_size=1_000) == size
    assert math.ceil(requests / size) == chunks
    assert chunks <= MAX_CHUNKS_PER_RUN or size == chunk_size_for(10 * requests, chunk_size=1_000)


def test_a_chunk_size_asked_for_is_kept_even_above_the_cap() -> None:
    assert chunk_size_for(10_000_000, chunk_size=20_000) == 20_000
