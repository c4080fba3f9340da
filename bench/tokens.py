"""Client token estimate and simulator token counter against OpenAI's tokenizers: `python bench/tokens.py`.

The reference is ``bpe-openai`` (GitHub's exact Rust BPE with the o200k_base and cl100k_base
vocabularies embedded; ``pip install bpe-openai`` into the interpreter that runs this script). It
is a measuring stick only, never a dependency of the project. The script imports just the two
pure-Python modules it measures (``core/pricing/_tokens.py`` and ``simulator/_tokens.py``),
skipping the packages' ``__init__`` and their httpx/aiohttp imports, so any Python 3.11 that has
bpe-openai runs it from a checkout, e.g. the throwaway venv::

    python -m venv /tmp/bpevenv && /tmp/bpevenv/bin/pip install bpe-openai
    /tmp/bpevenv/bin/python bench/tokens.py                # tables against o200k_base and cl100k_base
    /tmp/bpevenv/bin/python bench/tokens.py --worst 5      # plus the 5 worst texts per category

The corpus, built fresh each run from files on the machine (a missing source is skipped and
listed): every prompt of ``examples/prompts.jsonl`` as chat messages, with the framing counted
the way OpenAI's cookbook does (3 tokens a message, plus its role, 1 more and the name for
``name``, 3 to prime the reply); general English prose and prompt-like instructions written for
this script; the Rust book's paragraphs and lists and the IDLE manual (rustup and CPython docs);
licence texts; stdlib docstrings; package READMEs and git release notes; Python, Rust, JavaScript,
C and shell code; JSON; and Spanish, German, French, Russian, Japanese, Chinese, Korean, Arabic and
Hindi text (Rust by Example translations, gettext catalogues, CPython's CJK test files).

For each category it prints the exact total, each estimate's total and the signed error of the
totals (what a cost preview or a TPM budget sees), and the median and 90th percentile of the
absolute per-text error (what one request sees). Then the per-call cost of both counters.
"""

from __future__ import annotations

import argparse
import ast
import gettext
import html.parser
import json
import statistics
import sys
import sysconfig
import textwrap
import timeit
import types
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bpe_openai

ROOT = Path(__file__).resolve().parent.parent


def _load_core() -> tuple[types.ModuleType, types.ModuleType]:
    """Import the two counters without running the packages' ``__init__.py`` (httpx, aiohttp, ...)."""
    for name, directory in (("llm_dispatch.core", "core"), ("llm_dispatch.simulator", "simulator")):
        package = types.ModuleType(name)
        package.__path__ = [str(ROOT / directory)]
        sys.modules.setdefault(name, package)
    from llm_dispatch.core import _tokens
    from llm_dispatch.simulator import _tokens as _sim_tokens

    return _tokens, _sim_tokens


client, simulator = _load_core()


@dataclass(frozen=True)
class Sample:
    category: str
    source: str
    text: str = ""
    messages: tuple[dict[str, Any], ...] = ()


# --- text written for this benchmark -----------------------------------------------------------
# Little on a server is the everyday English people put in prompts, so some is written here:
# narrative, news, email, reviews, essays, and instructions in the style of system and user prompts.

GENERAL_PROSE = [
    "My grandmother kept a notebook of every meal she cooked for guests, with the date, who came, and "
    "what they left on their plates. When we cleared out her house we found forty years of them in a "
    "shoebox under the stairs. Reading them is like watching the town change: fewer roasts, more "
    "vegetables, and, from about 1998 onwards, a lot of people who 'don't eat gluten'.",
    "The city council voted on Thursday to close two of the three bridges over the river for repairs "
    "starting next spring. Engineers found corrosion in the supports during a routine inspection in "
    "August. The work is expected to take eighteen months and cost about $42 million, most of which "
    "will come from a state infrastructure grant. Commuters have been told to expect longer journeys.",
    "Hi Sarah,\n\nThanks for sending over the draft so quickly. I've read it twice and I think the "
    "structure works well, but the second section feels a bit long. Could we cut the history of the "
    "project down to a paragraph and move the budget table to an appendix? I'm free on Wednesday "
    "afternoon if you'd like to talk it through.\n\nBest,\nTom",
    "I bought these headphones for the commute and they've been great for about three months. The "
    "noise cancelling is genuinely good on the train, and the battery lasts the whole week. My only "
    "complaint is the case, which is bulky and doesn't fit in a jacket pocket. Four stars; I'd buy "
    "them again, but I wish they'd thought harder about the case.",
    "There is a particular kind of silence that falls over a library in the late afternoon. The "
    "students have gone, the light comes in low through the tall windows, and the only sound is the "
    "radiator ticking as it cools. It was in that silence, on a wet Tuesday in November, that Anna "
    "found the letter folded inside a book nobody had borrowed since 1962.",
    "Sleep is not a luxury. Adults who regularly get less than seven hours a night are more likely to "
    "suffer from heart disease, obesity and depression, and they make more mistakes at work. Yet in "
    "surveys most people say they would rather have an extra hour of free time than an extra hour of "
    "sleep. The problem is not knowledge; it is that the costs arrive slowly and the benefits of "
    "staying up are immediate.",
    "The Industrial Revolution began in Britain in the late eighteenth century, driven by cheap coal, "
    "a large colonial market, and a culture of practical invention. Textile mills were among the first "
    "factories, and the steam engine, improved by James Watt in the 1770s, freed them from the need "
    "to sit beside fast-flowing rivers. Within two generations the population of Manchester had grown "
    "more than tenfold.",
    "Preheat the oven to 200C. Toss the potatoes in olive oil, salt and a little rosemary, then spread "
    "them out on a tray so they don't touch. Roast for 40 minutes, turning once, until the edges are "
    "brown and crisp. They're best eaten straight away, but they'll keep in the fridge for two days.",
    "Dear hiring manager,\n\nI am writing to apply for the position of operations coordinator advertised "
    "on your website. For the past four years I have managed scheduling and logistics for a regional "
    "delivery company, where I reduced missed deliveries by a third by redesigning our route planning. "
    "I would welcome the chance to bring the same approach to your team.\n\nYours faithfully,\nMaria Lopez",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make "
    "glucose and oxygen. It happens mainly in the leaves, inside small structures called chloroplasts, "
    "which contain the green pigment chlorophyll. Almost all life on Earth depends on it, directly or "
    "indirectly, because it is the main way energy from the sun enters the food chain.",
    "We didn't win the match, but honestly it was the best we've played all season. Jamie scored in "
    "the first ten minutes, and for a while it looked like we might hold on. Then they brought on two "
    "fresh strikers and we just ran out of legs. Coach says if we play like that every week we'll be "
    "fine, and for once I believe him.",
    "Remote work has changed what offices are for. When people only come in two or three days a week, "
    "they come to meet, not to sit at a desk and answer email. Companies that understood this early "
    "have replaced rows of desks with meeting rooms and quiet corners; those that didn't are paying "
    "for floors that stand empty most of the week.",
]

INSTRUCTIONS = [
    "You are a helpful assistant for a software company. Answer questions about our products politely "
    "and concisely. If you don't know the answer, say so and suggest contacting support@example.com. "
    "Never make up prices, release dates or features.",
    "Summarize the following article in three bullet points. Each bullet should be one sentence of no "
    "more than 20 words. Do not include your own opinions.",
    "Translate the text below into French. Keep the formatting, including line breaks and bullet points, "
    "exactly as it is. Do not translate product names or code.",
    "Rewrite this paragraph so that a ten-year-old could understand it. Use short sentences and simple "
    "words, but keep all the important facts.",
    "Classify the sentiment of each customer review as positive, negative or neutral. Return one label "
    "per line, in the same order as the reviews, and nothing else.",
    "Act as an experienced Python reviewer. Read the function below and list any bugs, edge cases it "
    "does not handle, and places where the code could be clearer. Be specific and refer to line numbers.",
    "Write a short, friendly email to a customer whose order has been delayed by a week. Apologise, "
    "explain that the delay is caused by a supplier, and offer a 10% discount on their next order.",
    "Extract every date, person and organisation mentioned in the text and return them as JSON with the "
    "keys \"dates\", \"people\" and \"organisations\". Use ISO 8601 for dates. If a field has no values, "
    "return an empty list.",
    "You are a patient maths tutor. When the student asks a question, don't give the answer straight "
    "away: ask what they have tried, give a hint, and only show the full solution if they are still "
    "stuck after two hints.",
    "Read the contract clause below and explain, in plain English, what obligations it places on the "
    "supplier, what happens if they are not met, and whether anything is ambiguous.",
    "Generate five possible titles for a blog post about saving energy at home. The titles should be "
    "catchy but not clickbait, and no longer than ten words each.",
    "Answer the question using only the information in the context. If the context does not contain "
    "the answer, reply \"I don't know\". Quote the sentence you relied on.\n\nContext:\n{context}\n\n"
    "Question: {question}",
    "Please proofread the following text for spelling, grammar and punctuation. Make the minimum number "
    "of changes, keep British spelling, and list each change you made after the corrected text.",
    "Compare the two job offers below on salary, benefits, commute and career prospects. Present the "
    "comparison as a table, then give a one-paragraph recommendation.",
    "Given the meeting transcript, write the minutes: attendees, decisions made, action items with an "
    "owner and a due date for each, and open questions. Keep it under 300 words.",
    "Step 1: Read the user's message carefully.\nStep 2: Decide whether it is a billing, technical or "
    "account question.\nStep 3: If it is billing, ask for the invoice number. If it is technical, ask "
    "for the error message and the app version. If it is about the account, ask for the email address "
    "used to sign up.\nStep 4: Never ask for a password.",
]

INSTRUCTIONS_LONG = [
    "You are a support assistant for Northwind Outdoor, an online shop selling camping and hiking gear. "
    "Follow these rules in every reply:\n\n1. Be warm but brief: two to four sentences unless the "
    "customer asks for detail.\n2. For returns, explain that unused items can be returned within 30 "
    "days with the original receipt, and that the customer pays return shipping unless the item is "
    "faulty.\n3. For order status, ask for the order number if it is missing, and never guess a "
    "delivery date.\n4. If the customer is angry, acknowledge the problem before offering a solution.\n"
    "5. Do not recommend competitors' products, and do not discuss topics unrelated to the shop.\n6. "
    "If you cannot help, offer to pass the conversation to a human colleague and say that they usually "
    "reply within one working day.",
    "I'm preparing a presentation for our board next week about why we should move our customer "
    "database to a managed cloud service. The board are not technical, so I need to explain the "
    "benefits (less maintenance, automatic backups, easier scaling) and the risks (cost over time, "
    "vendor lock-in, data protection) without jargon. Can you draft an outline with six to eight "
    "slides, a title and three bullet points for each, and suggest one chart that would make the cost "
    "comparison clear? Please also list the three questions you think the board is most likely to ask, "
    "with a short answer for each.",
]


# --- gathering text from the machine -----------------------------------------------------------


def _spread(items: list[Any], count: int) -> list[Any]:
    """At most ``count`` items, evenly spaced through ``items`` (deterministic, not the first ones)."""
    if len(items) <= count:
        return items
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def _chunks(text: str, *, size: int) -> Iterator[str]:
    """Runs of whole paragraphs of at least ``size`` characters (the last one may be shorter)."""
    buffer: list[str] = []
    length = 0
    for paragraph in text.split("\n\n"):
        if not paragraph.strip():
            continue
        buffer.append(paragraph)
        length += len(paragraph) + 2
        if length >= size:
            yield "\n\n".join(buffer)
            buffer, length = [], 0
    if buffer:
        yield "\n\n".join(buffer)


def _line_chunks(text: str, *, size: int) -> Iterator[str]:
    """Runs of whole lines of at least ``size`` characters, for code."""
    buffer: list[str] = []
    length = 0
    for line in text.splitlines(keepends=True):
        buffer.append(line)
        length += len(line)
        if length >= size:
            yield "".join(buffer)
            buffer, length = [], 0
    if buffer and length > size // 4:
        yield "".join(buffer)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


class _Blocks(html.parser.HTMLParser):
    """The paragraphs, lists and code blocks inside an mdBook page's ``<main>``."""

    _KINDS = {"p": "p", "pre": "pre", "ul": "list", "ol": "list"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str]] = []
        self._in_main = False
        self._open: str | None = None  # the tag that opened the current block
        self._depth = 0
        self._parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "main":
            self._in_main = True
        elif self._in_main and self._open is None and tag in self._KINDS:
            self._open, self._depth, self._parts = tag, 1, []
        elif self._open is not None:
            if tag == self._open:
                self._depth += 1
            if tag == "li" and self._open in ("ul", "ol"):
                self._parts.append("\n- ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "main":
            self._in_main = False
        elif self._open is not None and tag == self._open:
            self._depth -= 1
            if self._depth == 0:
                text = "".join(self._parts)
                if self._open != "pre":  # HTML whitespace: one space, but keep the list's line breaks
                    text = "\n".join(" ".join(line.split()) for line in text.split("\n")).strip()
                if text.strip():
                    self.blocks.append((self._KINDS[self._open], text))
                self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._parts.append(data if self._open == "pre" else data.replace("\n", " "))


def _html_blocks(path: Path) -> list[tuple[str, str]]:
    parser = _Blocks()
    parser.feed(_read(path))
    return parser.blocks


def _book_pages(directory: Path) -> list[Path]:
    skip = {"print.html", "toc.html", "404.html", "index.html", "SUMMARY.html"}
    return sorted(p for p in directory.rglob("*.html") if p.name not in skip)


def _rust_docs() -> Path | None:
    found = sorted(Path.home().glob(".rustup/toolchains/stable-*/share/doc/rust/html"))
    return found[0] if found else None


def _site_dirs() -> list[Path]:
    dirs = []
    for base in dict.fromkeys((sys.prefix, sys.base_prefix)):
        purelib = sysconfig.get_paths(vars={"base": base, "platbase": base})["purelib"]
        dirs.append(Path(purelib))
    return [d for d in dirs if d.is_dir()]


STDLIB = Path(sysconfig.get_paths()["stdlib"])
STDLIB_MODULES = ("argparse", "asyncio/tasks", "collections/__init__", "dataclasses", "email/message",
                  "functools", "http/client", "json/__init__", "logging/__init__", "pathlib", "shutil",
                  "statistics", "subprocess", "textwrap", "typing", "unittest/case", "zipfile")


def _examples() -> Iterator[Sample]:
    for line in (ROOT / "examples" / "prompts.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        messages = record.get("messages") or [{"role": "user", "content": record["prompt"]}]
        yield Sample("examples.jsonl", "examples/prompts.jsonl", messages=tuple(messages))


def _handwritten() -> Iterator[Sample]:
    for text in GENERAL_PROSE:
        yield Sample("prose, general", "written here", text)
    for text in INSTRUCTIONS + INSTRUCTIONS_LONG:
        yield Sample("instructions", "written here", text)
    # The same instructions as a chat request, to check the framing on something other than the examples.
    for text in INSTRUCTIONS_LONG:
        messages = ({"role": "system", "content": text}, {"role": "user", "content": GENERAL_PROSE[2]})
        yield Sample("instructions", "written here, as chat", messages=messages)


def _rust_book() -> Iterator[Sample]:
    docs = _rust_docs()
    if docs is None:
        return
    paragraphs, lists, code = [], [], []
    for page in _book_pages(docs / "book"):
        for kind, text in _html_blocks(page):
            if kind == "p" and len(text) >= 80:
                paragraphs.append(text)
            elif kind == "list" and len(text) >= 80:
                lists.append(text)
            elif kind == "pre" and len(text) >= 200:
                code.append(text)
    for text in _spread(paragraphs, 300):
        yield Sample("prose, technical", "Rust book", text)
    for text in _spread(lists, 80):
        yield Sample("lists, markdown", "Rust book", text)
    for text in _spread(code, 100):
        yield Sample("code, other", "Rust book (Rust)", text)


def _idle_help() -> Iterator[Sample]:
    path = STDLIB / "idlelib" / "help.html"
    if not path.is_file():
        return
    parser = _Blocks()
    parser.feed("<main>" + _read(path))  # a Sphinx page: no <main>, take all of it
    texts = [text for kind, text in parser.blocks if kind in ("p", "list") and len(text) >= 80]
    for text in _spread(texts, 80):
        yield Sample("instructions", "IDLE manual", text)


def _licences() -> Iterator[Sample]:
    paths = [STDLIB / "LICENSE.txt"] + [Path("/usr/share/common-licenses") / name
                                        for name in ("Apache-2.0", "GPL-3", "MPL-2.0", "LGPL-2.1", "Artistic")]
    texts = [chunk for path in paths if path.is_file() for chunk in _chunks(_read(path), size=1200)]
    for text in _spread(texts, 80):
        yield Sample("legal", "licence texts", text)


def _docstrings() -> Iterator[Sample]:
    texts = []
    for module in STDLIB_MODULES:
        path = STDLIB / f"{module}.py"
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(_read(path))):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 150:
                    texts.append(doc)
    for text in _spread(texts, 200):
        yield Sample("docstrings", "CPython stdlib", text)


def _readmes() -> Iterator[Sample]:
    texts = []
    for site in _site_dirs():
        for metadata in sorted(site.glob("*.dist-info/METADATA")):
            body = _read(metadata).partition("\n\n")[2]
            if len(body) >= 3000:
                texts.extend(_spread(list(_chunks(body, size=1500)), 4))
    for path in sorted(Path.home().glob(".pyenv/*.md")):
        texts.extend(_spread(list(_chunks(_read(path), size=1500)), 6))
    for text in _spread(texts, 120):
        yield Sample("lists, markdown", "READMEs", text)
    notes = sorted(Path("/usr/share/doc/git/RelNotes").glob("2.*.txt"))
    for path in _spread(notes, 40):
        yield Sample("lists, markdown", "git release notes", next(_chunks(_read(path), size=2000)))


def _code() -> Iterator[Sample]:
    python = [chunk for module in STDLIB_MODULES if (STDLIB / f"{module}.py").is_file()
              for chunk in _line_chunks(_read(STDLIB / f"{module}.py"), size=1500)]
    for text in _spread(python, 200):
        yield Sample("code, Python", "CPython stdlib", text)
    others = [
        ("JavaScript", sorted(Path("/usr/lib/node_modules/npm/lib/commands").glob("*.js"))),
        ("C", sorted(Path("/usr/share/doc/zlib1g-dev/examples").glob("*.c"))),
        ("shell", sorted(Path.home().glob(".pyenv/libexec/pyenv-*"))),
    ]
    for language, paths in others:
        chunks = [chunk for path in paths if path.is_file() for chunk in _line_chunks(_read(path), size=1500)]
        for text in _spread(chunks, 40):
            yield Sample("code, other", language, text)


def _json() -> Iterator[Sample]:
    yield Sample("JSON", "prices.json", _read(ROOT / "core" / "prices.json"))
    for line in _spread((ROOT / "examples" / "prompts.jsonl").read_text(encoding="utf-8").splitlines(), 20):
        yield Sample("JSON", "prompts.jsonl lines", line)
    documents = []
    for site in _site_dirs():
        documents += sorted(site.glob("jsonschema_specifications/schemas/*/metaschema.json"))
        documents += sorted(site.glob("boto3/data/*/*/resources-1.json"))
    for path in _spread(documents, 30):
        data = json.loads(_read(path))
        # Both shapes a prompt carries: pretty-printed documents and compact API payloads.
        yield Sample("JSON", "schemas, indented", json.dumps(data, indent=2)[:3000])
        yield Sample("JSON", "schemas, compact", json.dumps(data, separators=(",", ":"))[:3000])
    config = {k: v for k, v in sorted(sysconfig.get_config_vars().items()) if isinstance(v, str | int)}
    items = list(config.items())
    for start in _spread(list(range(0, len(items), 40)), 10):
        yield Sample("JSON", "sysconfig vars", json.dumps(dict(items[start:start + 40])))


def _catalogue(language: str) -> list[str]:
    """The translated strings of a language's gettext catalogues, in chunks of ~800 characters."""
    chunks = []
    for path in sorted(Path(f"/usr/share/locale/{language}/LC_MESSAGES").glob("*.mo"))[:12]:
        try:
            with path.open("rb") as handle:
                catalogue = gettext.GNUTranslations(handle)._catalog  # type: ignore[attr-defined]
        except (OSError, UnicodeDecodeError):  # not a catalogue this module can read
            continue
        strings = [v for k, v in catalogue.items() if k and isinstance(v, str) and len(v) > 20]
        chunks += list(_chunks("\n\n".join(strings), size=800))
    return chunks


def _translations(docs: Path | None, language: str) -> list[str]:
    if docs is None:
        return []
    return [text for page in _book_pages(docs / "rust-by-example" / language)
            for kind, text in _html_blocks(page) if kind == "p" and len(text) >= 40]


def _other_languages() -> Iterator[Sample]:
    docs = _rust_docs()
    for text in _spread(_translations(docs, "es"), 60):
        yield Sample("es/de/fr/ru", "Rust by Example (es)", text)
    for language in ("de", "fr", "ru"):
        for text in _spread(_catalogue(language), 30):
            yield Sample("es/de/fr/ru", f"gettext ({language})", text)
    for language in ("ja", "zh", "ko"):
        for text in _spread(_translations(docs, language), 50):
            yield Sample("CJK", f"Rust by Example ({language})", text)
    for path in sorted((STDLIB / "test" / "cjkencodings").glob("*-utf8.txt"))[:8]:
        yield Sample("CJK", "CPython cjkencodings", _read(path)[:2000])
    for language in ("ar", "hi"):
        for text in _spread(_catalogue(language), 30):
            yield Sample("ar/hi", f"gettext ({language})", text)


SOURCES: tuple[Callable[[], Iterable[Sample]], ...] = (
    _examples, _handwritten, _rust_book, _idle_help, _licences, _docstrings, _readmes, _code, _json,
    _other_languages,
)


def corpus() -> list[Sample]:
    return [sample for source in SOURCES for sample in source()]


# --- counting -------------------------------------------------------------------------------------


def exact_text(encoding: Any, text: str) -> int:
    return len(encoding.encode_ordinary(text))


def exact_messages(encoding: Any, messages: Iterable[dict[str, Any]]) -> int:
    """OpenAI cookbook's ``num_tokens_from_messages`` for gpt-4o / gpt-4 class models."""
    total = 3  # <|start|>assistant<|message|> primes the reply
    for message in messages:
        total += 3
        for key, value in message.items():
            total += exact_text(encoding, value)
            if key == "name":
                total += 1
    return total


@dataclass(frozen=True)
class Counted:
    sample: Sample
    exact: dict[str, int]
    client: int
    simulator: int


def count(samples: list[Sample], encodings: dict[str, Any]) -> list[Counted]:
    rows = []
    for sample in samples:
        if sample.messages:
            messages = list(sample.messages)
            exact = {name: exact_messages(enc, messages) for name, enc in encodings.items()}
            rows.append(Counted(sample, exact, client.estimate_prompt_tokens(messages),
                                simulator.count_message_tokens(messages)))
        else:
            exact = {name: exact_text(enc, sample.text) for name, enc in encodings.items()}
            rows.append(Counted(sample, exact, client.estimate_text_tokens(sample.text),
                                simulator.count_tokens(sample.text)))
    return rows


def _signed(estimate: int, exact: int) -> float:
    return (estimate - exact) / exact * 100 if exact else 0.0


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def table(rows: list[Counted], encoding: str) -> str:
    header = (f"{'category':<17}{'texts':>6}{'exact':>9} | {'client':>8}{'Σ err':>8}{'med|e|':>8}{'p90|e|':>8}"
              f" | {'sim':>8}{'Σ err':>8}{'med|e|':>8}{'p90|e|':>8}")
    lines = [f"against {encoding} (token totals; errors in %, + = overestimate)", header, "-" * len(header)]
    categories = list(dict.fromkeys(r.sample.category for r in rows))
    for category in [*categories, "all"]:
        group = [r for r in rows if category in ("all", r.sample.category)]
        exact = sum(r.exact[encoding] for r in group)
        cells = [f"{category:<17}{len(group):>6}{exact:>9}"]
        for attribute in ("client", "simulator"):
            total = sum(getattr(r, attribute) for r in group)
            errors = [abs(_signed(getattr(r, attribute), r.exact[encoding])) for r in group]
            cells.append(f"{total:>8}{_signed(total, exact):>+8.1f}{statistics.median(errors):>8.1f}"
                         f"{_p90(errors):>8.1f}")
        if category == "all":
            lines.append("-" * len(header))
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def worst(rows: list[Counted], encoding: str, count: int) -> str:
    lines = [f"worst {count} client estimates per category against {encoding}:"]
    for category in dict.fromkeys(r.sample.category for r in rows):
        group = sorted((r for r in rows if r.sample.category == category),
                       key=lambda r: -abs(_signed(r.client, r.exact[encoding])))
        for r in group[:count]:
            text = r.sample.text or json.dumps(r.sample.messages, ensure_ascii=False)
            lines.append(f"  {category:<17}{r.exact[encoding]:>6} client {_signed(r.client, r.exact[encoding]):+6.1f}%"
                         f" sim {_signed(r.simulator, r.exact[encoding]):+6.1f}%  {r.sample.source}: {text[:90]!r}")
    return "\n".join(lines)


def timings() -> str:
    short = "Summarise this customer support transcript in three bullet points."
    paragraph = " ".join(GENERAL_PROSE)[:2000]
    lines = ["per-call cost (best of 5 timeit runs):"]
    for label, func in (("client estimate_text_tokens", client.estimate_text_tokens),
                        ("simulator count_tokens", simulator.count_tokens)):
        for name, text in (("short prompt", short), ("2,000 chars", paragraph)):
            number = 20_000 if len(text) < 200 else 2_000
            best = min(timeit.repeat(lambda: func(text), number=number, repeat=5)) / number
            lines.append(f"  {label:<28} {name:<13} {best * 1e6:8.2f} µs")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worst", type=int, default=0, metavar="N", help="also list the N worst texts per category")
    parser.add_argument("--no-timing", action="store_true", help="skip the per-call timings")
    args = parser.parse_args()

    encodings = {name: bpe_openai.get_encoding(name) for name in ("o200k_base", "cl100k_base")}
    samples = corpus()
    sources = Counter(s.source for s in samples)
    print(f"{len(samples)} texts, {sum(len(s.text) for s in samples):,} characters, from {len(sources)} sources:")
    print(textwrap.fill(", ".join(f"{source} ({n})" for source, n in sources.items()), width=100,
                        initial_indent="  ", subsequent_indent="  "))
    rows = count(samples, encodings)
    for encoding in encodings:
        print()
        print(table(rows, encoding))
    if args.worst:
        print()
        print(worst(rows, "o200k_base", args.worst))
    if not args.no_timing:
        print()
        print(timings())


if __name__ == "__main__":
    main()
