"""How a budget counts a call's input before it goes out: exact, bound, estimate.

tiktoken's real encodings download on first use, which this machine cannot do; the tests build a
small byte-level BPE encoding of their own (every byte a token, plus a few merges) and hand it to
the real counting code through its loader.
"""

from __future__ import annotations

import logging

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from hierplan.models.base import Message, ModelRequest, OutputSchema, ToolCall, ToolSpec
from hierplan.models.counting import (
    ExactCounter,
    bound_input_tokens,
    input_counter,
)
from hierplan.models.tokens import estimate_input_tokens

# GPT-2's pre-tokenizer pattern: what splits text into words before the merges apply.
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\w+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+"""


def small_encoding() -> tiktoken.Encoding:
    """A byte-level BPE: the 256 bytes, then merges of a few common English pairs."""
    ranks = {bytes([b]): b for b in range(256)}
    for text in ("th", "he", "in", "er", "an", " t", " a", "the", " the", "ing", "es", "on"):
        ranks.setdefault(text.encode(), len(ranks))
    return tiktoken.Encoding("test_bpe", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})


ENCODING = small_encoding()


def loader(model_name: str) -> tiktoken.Encoding:
    return ENCODING


def tokens_of(text: str) -> int:
    return len(ENCODING.encode(text, disallowed_special=()))


texts = st.text(max_size=300)
requests = st.builds(
    lambda contents, tools, calls, schema: ModelRequest(
        messages=tuple(
            Message("user" if i % 2 == 0 else "assistant", c, tool_calls=calls if i == 1 else ())
            for i, c in enumerate(contents)
        ),
        tools=tuple(ToolSpec(n, d, {"type": "object", "x": d}) for n, d in tools),
        output_schema=OutputSchema("plan", {"title": schema}) if schema is not None else None,
    ),
    st.lists(texts, min_size=1, max_size=4),
    st.lists(st.tuples(st.text(min_size=1, max_size=20), texts), max_size=3),
    st.lists(
        st.builds(lambda n, a: ToolCall("c1", n, {"arg": a}), st.text(max_size=20), texts),
        max_size=2,
    ).map(tuple),
    st.none() | texts,
)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_the_bound_is_never_below_a_byte_level_tokenizers_count(request: ModelRequest) -> None:
    """Whatever the text (any Unicode, emoji, no spaces at all), a byte-level BPE makes at most
    one token per byte: the bound holds against the exact count and the text's own tokens."""
    exact = ExactCounter("gpt-test", loader)(request)
    bound = bound_input_tokens(request)
    assert exact <= bound
    every_text = "".join(m.content for m in request.messages)
    assert tokens_of(every_text) <= bound


def test_text_the_estimate_undercounts_is_reserved_by_the_count_the_provider_makes() -> None:
    """Digits and punctuation make more tokens than four characters each: the estimate
    undercounts them, the exact count does not, and the bound is above both."""
    dense = " ".join(f"{i}:{i * 7919 % 1000};" for i in range(400))
    request = ModelRequest(messages=(Message("user", dense),))
    exact = ExactCounter("gpt-test", loader)(request)
    assert exact > estimate_input_tokens(request)
    assert exact >= tokens_of(dense)
    assert bound_input_tokens(request) >= exact


def test_the_exact_count_follows_the_merges_of_the_encoding() -> None:
    """English with the merged pairs counts fewer tokens than bytes: the exact count is the
    encoding's, not a byte count."""
    text = "the thing in the theatre then the other one " * 20
    request = ModelRequest(messages=(Message("user", text),))
    exact = ExactCounter("gpt-test", loader)(request)
    assert tokens_of(text) < len(text.encode())
    assert exact < bound_input_tokens(request)
    # OpenAI's framing: three tokens a message and three to prime the reply, the role's own.
    assert exact == tokens_of(text) + tokens_of("user") + 3 + 3


def test_a_tokenizer_that_cannot_load_falls_back_to_the_bound_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[str] = []

    def offline(model_name: str) -> tiktoken.Encoding:
        attempts.append(model_name)
        raise OSError("could not download o200k_base.tiktoken: no network")

    counter = ExactCounter("gpt-5-mini", offline)
    request = ModelRequest(messages=(Message("user", "héllo wörld " * 10),))
    with caplog.at_level(logging.WARNING, logger="hierplan"):
        counts = [counter(request) for _ in range(3)]
    assert counts == [bound_input_tokens(request)] * 3
    assert attempts == ["gpt-5-mini"]  # not tried again on every call
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "gpt-5-mini" in warnings[0] and "no network" in warnings[0]
    assert "by the bound" in warnings[0]


def test_without_tiktoken_the_warning_says_what_to_install(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def missing(model_name: str) -> tiktoken.Encoding:
        raise ImportError("No module named 'tiktoken'")

    with caplog.at_level(logging.WARNING, logger="hierplan"):
        ExactCounter("gpt-5-mini", missing)(ModelRequest(messages=(Message("user", "x"),)))
    assert "pip install 'hierplan[tiktoken]'" in caplog.text


@pytest.mark.parametrize(
    ("reservation", "provider", "custom", "expected"),
    [
        ("exact", "openai", False, "exact"),
        ("exact", "openai", True, "bound"),  # a compatible server's tokenizer is unknown
        ("exact", "anthropic", False, "bound"),  # no tokenizer of Anthropic's runs locally
        ("exact", "sim", False, "estimate"),  # the simulator counts its usage by the estimate
        ("bound", "openai", False, "bound"),
        ("bound", "sim", False, "bound"),
        ("estimate", "openai", False, "estimate"),
        ("estimate", "anthropic", False, "estimate"),
    ],
)
def test_each_reservation_counts_as_documented(
    reservation: str, provider: str, custom: bool, expected: str
) -> None:
    counter = input_counter(
        reservation,  # type: ignore[arg-type]
        provider,
        "gpt-5-mini",
        custom_server=custom,
        loader=loader,
    )
    request = ModelRequest(messages=(Message("user", "count 1, 2, 3; then 4!" * 30),))
    counts = {
        "exact": ExactCounter("gpt-5-mini", loader)(request),
        "bound": bound_input_tokens(request),
        "estimate": estimate_input_tokens(request),
    }
    assert len(set(counts.values())) == 3  # the three ways differ on this request
    assert counter(request) == counts[expected]


def test_the_real_loader_asks_tiktoken_for_the_models_encoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real loading code stays: it maps a model to its encoding name and asks tiktoken for
    it (here answered from the test's own encoding instead of a download)."""
    from hierplan.models import counting

    asked: list[str] = []

    def get_encoding(name: str) -> tiktoken.Encoding:
        asked.append(name)
        return ENCODING

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    assert counting.tiktoken_encoding("gpt-4o") is ENCODING
    assert counting.tiktoken_encoding("a-model-tiktoken-does-not-know") is ENCODING
    assert asked == ["o200k_base", "o200k_base"]
