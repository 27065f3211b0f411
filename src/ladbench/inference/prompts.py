"""Prompt texts, identifier formats, and parsing of generated answers (METHOD §1, §6).

Which variant uses which text is declared in the variant registry (``ladbench.variants``).

The digit prompts are the reference's text verbatim. Other identifier formats (paper,
Appendix D.2) use the same sentences with the identifiers named, e.g. "indexed from A to
D" and "Respond with the index letter only".
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

IDENTIFIER_FORMATS = ("digits", "upper", "lower", "roman", "words")

_ROMAN = ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII", "XIII", "XIV", "XV", "XVI")
_WORDS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
          "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth")
#: The most candidates a prompt can name (the identifier lists above); the config schema's
#: benchmarks.n_candidates maximum is the same (tests/test_config.py checks it).
MAX_CANDIDATES = len(_ROMAN)


def identifiers(fmt: str, n: int) -> list[str]:
    """The ``n`` candidate identifiers of format ``fmt``: position p (0-based) is named ``identifiers(...)[p]``."""
    if not 1 <= n <= MAX_CANDIDATES:
        raise ValueError(f"number of candidates must be in 1..{MAX_CANDIDATES}; got {n}")
    if fmt == "digits":
        return [str(i) for i in range(1, n + 1)]
    if fmt == "upper":
        return [chr(ord("A") + i) for i in range(n)]
    if fmt == "lower":
        return [chr(ord("a") + i) for i in range(n)]
    if fmt == "roman":
        return list(_ROMAN[:n])
    if fmt == "words":
        return list(_WORDS[:n])
    raise ValueError(f"unknown identifier format {fmt!r}; choose one of {', '.join(IDENTIFIER_FORMATS)}")


@dataclass(frozen=True)
class _Naming:
    indexed: str      # completes "Given {N} images indexed ..."
    answer: str       # completes "Respond with the ... only"
    final: str        # CoT: "output only the final answer index (...)"


def _naming(fmt: str, n: int) -> _Naming:
    ids = identifiers(fmt, n)
    first, last = ids[0], ids[-1]
    if fmt == "digits":
        return _Naming(f"from {first} to {last}", "index number", f"a single integer from {first} to {last}")
    if fmt in ("upper", "lower"):
        return _Naming(f"from {first} to {last}", "index letter", f"a single letter from {first} to {last}")
    if fmt == "roman":
        return _Naming(f"with Roman numerals from {first} to {last}", "index Roman numeral",
                       f"a single Roman numeral from {first} to {last}")
    listed = ", ".join(ids[:-1]) + f" and {last}" if n > 1 else last
    return _Naming(f"as {listed}", "index word", f"a single word among {', '.join(ids)}")


INSTRUCTION_SENTENCE = ("Please note that the provided images have been randomly shuffled, so it is essential to "
                        "consider them fairly and without bias. Analyze the visual content objectively and do not "
                        "be influenced by the order of the images.")


def _task(n: int, fmt: str) -> tuple[str, _Naming]:
    nm = _naming(fmt, n)
    return f"Given {n} images indexed {nm.indexed}, identify the image that best matches the provided caption.", nm


def answer_prompt(sentence: str | None = None) -> Callable[[int, str, str], str]:
    """The scoring prompt (vanilla), with ``sentence`` between the task and the answer format
    when given (the instruction variant's)."""
    def text(n: int, caption: str, fmt: str = "digits") -> str:
        task, nm = _task(n, fmt)
        middle = f"{sentence} " if sentence else ""
        return f"{task} {middle}Respond with the {nm.answer} only and nothing else.\nCaption: {caption}\nAnswer: "
    return text


def cot_prompt(n: int, caption: str, fmt: str = "digits") -> str:
    """Chain of thought: reasoning inside <think> tags, then the index."""
    task, nm = _task(n, fmt)
    return (f"{task}\nPlease think step by step. First, write your reasoning inside <think> and </think> tags. "
            f"Then, after the closing </think> tag, output only the final answer index ({nm.final}).\n"
            f"Caption: {caption}\nAnswer: <think>")


def self_consistency_prompt(n: int, caption: str, fmt: str = "digits") -> str:
    """Self-consistency: reasoning, then "The answer is <index>"."""
    task, _ = _task(n, fmt)
    return (f"{task}\nPlease think step by step to analyze the content of the images. After your reasoning, "
            f"provide the final answer in the exact format: \"The answer is <index>\".\nCaption: {caption}\nAnswer: ")


def _identifier_pattern(fmt: str, n: int) -> re.Pattern[str]:
    ids = sorted(identifiers(fmt, n), key=len, reverse=True)          # longest first: "III" before "I"
    if fmt == "digits":
        return re.compile(r"(?<!\d)(\d+)(?!\d)")
    flags = re.IGNORECASE if fmt == "words" else 0
    return re.compile(r"(?<![A-Za-z])(" + "|".join(map(re.escape, ids)) + r")(?![A-Za-z])", flags)


def parse_last_identifier(text: str, n: int, fmt: str = "digits") -> int:
    """Position (0-based) named by the LAST valid identifier in ``text``, or -1 (METHOD §6: CoT).

    For digits, the last integer in 1..n (integers outside the range are skipped).
    """
    ids = identifiers(fmt, n)
    lookup = {s.lower() if fmt == "words" else s: p for p, s in enumerate(ids)}
    for match in reversed(list(_identifier_pattern(fmt, n).finditer(text))):
        token = match.group(1).lower() if fmt == "words" else match.group(1)
        if token in lookup:
            return lookup[token]
    return -1


def parse_last_int(text: str, n: int) -> int:
    """Position (0-based) named by the last run of decimal digits in ``text`` whose int() is in
    1..n, or -1: the reference's reading of a digit reply (its ``parse_digit_answer``), where
    "03" and any Unicode decimal digit ("３", "٣") count as their value."""
    values = [int(run) for run in re.findall(r"\d+", text)]   # \d: Unicode decimal digits, as int() reads
    valid = [value for value in values if 1 <= value <= n]
    return valid[-1] - 1 if valid else -1


def parse_answer_is(text: str, n: int, fmt: str = "digits") -> int:
    """Self-consistency parsing: the last "The answer is <k>", else the last valid identifier."""
    ids = identifiers(fmt, n)
    flags = re.IGNORECASE if fmt == "words" else 0
    alternatives = "|".join(map(re.escape, sorted(ids, key=len, reverse=True)))
    found = re.findall(r"[Tt]he answer is\s*\**\s*(" + alternatives + r")(?![A-Za-z0-9])", text, flags)
    if found:
        token = found[-1]
        for p, s in enumerate(ids):
            if s == token or (fmt == "words" and s == token.lower()):
                return p
    return parse_last_identifier(text, n, fmt)


def majority_vote(parsed: Sequence[int]) -> int:
    """Most frequent valid answer (>= 0); ties go to the answer seen first; -1 if none is valid."""
    valid = [p for p in parsed if p >= 0]
    if not valid:
        return -1
    counts = Counter(valid)
    best = max(counts.values())
    return next(p for p in valid if counts[p] == best)
