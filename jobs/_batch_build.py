"""A job's batch input files built as its open prompts are read, in input order a page at a time: identical
requests share one line (all their prompts found by request when the first one is read), embeddings texts are packed
many to a line (``core.Packer``, within the batch's cap on texts), and each file is handed back with its members once
it is complete, so memory holds the files being filled, never the job."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path


from llm_dispatch import storage
from llm_dispatch.core import (
    EMBEDDING_PACK_LIMITS,
    BatchFile,
    BatchFileWriter,
    BatchLimits,
    CachePlan,
    ChatRequest,
    Packer,
    RepeatedKeys,
    RetryFailed,
    key_hash,
    member_id,
    pack_key,
)

__all__ = ["BatchBuilder", "BuiltFile", "Group", "request_groups"]


@dataclass(frozen=True, slots=True)
class Group:
    """One line: the request of its first (earliest) prompt, and every open prompt making that request."""

    first: storage.WorkRow
    prompt_ids: Sequence[int]


@dataclass(frozen=True, slots=True)
class BuiltFile:
    """A complete input file and the prompts its lines answer, ``(prompt_id, custom_id)`` each."""

    provider: str
    file: BatchFile
    members: list[tuple[int, str]]
    # The model its prompts were recorded under (the file's is the name the provider's API knows).
    model: str


async def request_groups(
    sessions: storage.Sessions,
    *,
    job_id: str,
    page: int,
    dedupe: bool,
    retry_failed: RetryFailed,
) -> AsyncIterator[list[Group]]:
    """The job's open batch-routed prompts as groups of identical requests, a keyset page at a time in input order.

    The requests more than one prompt of the job makes are counted by the database first (from an index alone:
    ``storage.job_repeated_keys``); when one of those is first read, all its open prompts (later pages included) are
    found by request and join its group, and its later prompts are passed over. Memory: a page, and those repeated requests' keys. Input order keeps
    each batch's prompts side by side in the table, so recording and settling a batch touches few pages.
    Without ``dedupe`` each prompt is its own group.
    """
    repeated = await storage.job_repeated_keys(sessions, job_id=job_id) if dedupe else RepeatedKeys()
    grouped: set[int] = set()  # the hashes of the repeated requests whose group is made
    async for rows in storage.unfinished_work_in_order(sessions, job_id=job_id, page=page, planned_route="batch",
                                                       retry_failed=retry_failed):
        firsts = {row.dedupe_key for row in rows
                  if row.dedupe_key in repeated and key_hash(row.dedupe_key) not in grouped}
        members: dict[str, list[int]] = {}
        if firsts:
            for prompt in await storage.unfinished_prompts(sessions, job_id=job_id, dedupe_keys=firsts,
                                                           planned_route="batch", retry_failed=retry_failed):
                members.setdefault(prompt.dedupe_key, []).append(prompt.id)
        groups: list[Group] = []
        for row in rows:
            if row.dedupe_key not in repeated:
                groups.append(Group(first=row, prompt_ids=(row.id,)))
            elif (request := key_hash(row.dedupe_key)) not in grouped:
                grouped.add(request)
                # Found again by request: a prompt sent meanwhile (by another run) is no longer open.
                groups.append(Group(first=row, prompt_ids=members.get(row.dedupe_key) or (row.id,)))
        if groups:
            yield groups


class BatchBuilder:
    """Input files per provider (at its limits), model and endpoint, filled a group at a time.

    ``use`` (on the event loop: it may open a provider's client) readies a provider's files; ``add`` and
    ``close`` (plain file writing, fine in a worker thread) return the files they completed. Embeddings groups that
    may share a request are packed into one line: the line's ``custom_id`` is its first group's, and each group's
    members are named after it and their text's place in it (``core.member_id``). A batch's lines are filled
    evenly to its cap on texts (50,000 at OpenAI: 25 lines of 2,000).
    """

    def __init__(self, *, directory: Path, provider_of: Callable[[str], str],
                 upstream: Callable[[str], str] = lambda model: model, cache_plan: CachePlan | None = None) -> None:
        self.directory = Path(directory)
        self.provider_of = provider_of
        # A recorded model's name on its provider's API (a declared provider's without its ``NAME/``): the lines'.
        self.upstream = upstream
        # (provider, model as sent) -> the model as recorded.
        self._recorded: dict[tuple[str, str], str] = {}
        # The Batch API lane's cache plan (``core.plan_caches(lane="batch")``): each line as the plan writes it.
        self.cache_plan = cache_plan
        self._writers: dict[str, BatchFileWriter] = {}
        self._packers: dict[str, Packer[Group]] = {}
        # Members of the file being filled, per (provider, model, endpoint): one open file each.
        self._members: dict[tuple[str, str, str], list[tuple[int, str]]] = {}

    def needs(self, groups: Sequence[Group]) -> set[str]:
        """Providers of these groups with no files yet."""
        return {self.provider_of(group.first.model) for group in groups} - self._writers.keys()

    def use(self, provider: str, *, limits: BatchLimits) -> None:
        self._writers[provider] = BatchFileWriter(directory=self.directory, limits=limits,
                                                  prefix=f"in-{provider}-{time.time_ns()}")
        packing = EMBEDDING_PACK_LIMITS.spread(limits.max_embedding_inputs)
        if limits.max_line_inputs is not None:
            packing = replace(packing, max_inputs=min(packing.max_inputs, limits.max_line_inputs))
        self._packers[provider] = Packer(limits=packing)

    def add(self, groups: Sequence[Group]) -> list[BuiltFile]:
        built: list[BuiltFile] = []
        for group in groups:
            first = group.first
            provider = self.provider_of(first.model)
            request = ChatRequest(model=self.upstream(first.model), messages=first.messages, params=first.params,
                                  endpoint=first.endpoint)
            if self.cache_plan is not None:
                request, _ = self.cache_plan.prepare(replace(request, model=first.model))
                request = replace(request, model=self.upstream(first.model))
            self._recorded.setdefault((provider, request.model), first.model)
            key = pack_key(request)
            if key is None:
                self._line(provider, [group], request, built)
            elif (pack := self._packers[provider].add(key, group, request)) is not None:
                self._line(provider, pack.members, pack.request(), built)
        return built

    def close(self) -> list[BuiltFile]:
        built: list[BuiltFile] = []
        for provider, packer in sorted(self._packers.items()):
            for pack in packer.close():
                self._line(provider, pack.members, pack.request(), built)
        for provider, writer in sorted(self._writers.items()):
            for file in writer.close():
                built.append(BuiltFile(provider=provider, file=file,
                                       members=self._members.pop((provider, file.model, file.endpoint)),
                                       model=self._recorded[(provider, file.model)]))
        return built

    def discard(self) -> None:
        """Remove the files still being filled."""
        for writer in self._writers.values():
            writer.discard()
        self._members.clear()
        self._packers.clear()

    def _line(self, provider: str, groups: Sequence[Group], request: ChatRequest, built: list[BuiltFile]) -> None:
        """Write one line for ``groups`` (several: a packed request, its texts in their order)."""
        first = groups[0].first
        # The line's custom_id names its first prompt row: traceable, unique in the file, and within Anthropic's
        # custom_id rule (1-64 of [A-Za-z0-9_-]).
        custom_id = f"p{first.id}"
        done = self._writers[provider].add(custom_id, request)
        # By the name sent, as the writer splits its files (one per provider, so one recorded name each).
        key = (provider, request.model, first.endpoint)
        if done is not None:
            built.append(BuiltFile(provider=provider, file=done, members=self._members.pop(key),
                                   model=self._recorded[(provider, request.model)]))
        members = self._members.setdefault(key, [])
        if len(groups) == 1:
            members.extend((prompt_id, custom_id) for prompt_id in groups[0].prompt_ids)
            return
        for index, group in enumerate(groups):
            name = member_id(custom_id, index)
            members.extend((prompt_id, name) for prompt_id in group.prompt_ids)
