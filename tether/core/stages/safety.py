"""Safety classification: a pluggable interface plus one real, cheap built-in classifier.

`SecretDetector` finds credentials (cloud keys, private keys, API tokens) in input text, so an
agent that reads a `.env` file does not ship its secrets upstream unnoticed. Depending on
`[safety] mode` the pipeline records findings (`flag`: logs and metrics, never the secret itself)
or rejects the request (`block`: 400 `content_blocked`). Only new items are classified; verdicts
for the cached prefix are already on the chain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Finding:
    kind: str  # e.g. "aws_access_key"
    index: int  # which of the classified texts


class Classifier(Protocol):
    name: str

    def classify(self, texts: Sequence[str]) -> list[Finding]: ...


_PATTERNS = {
    "aws_access_key": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "private_key": r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |PGP |ENCRYPTED )?PRIVATE KEY(?: BLOCK)?-----",
    "github_token": r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
    "openai_key": r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{32,}\b",
    "slack_token": r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b",
    "google_api_key": r"\bAIza[0-9A-Za-z_-]{35}\b",
    "stripe_key": r"\b(?:sk|rk)_live_[0-9A-Za-z]{24,}\b",
    "jwt": r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\b",
}


# Literal fragments at least one of which every pattern above contains. Substring search runs at
# memory speed, so text without any of them (almost all text) skips the regex pass entirely.
_LITERALS = ("AKIA", "ASIA", "PRIVATE KEY", "gh", "sk-", "xox", "AIza", "_live_", "eyJ")


class SecretDetector:
    """A literal prefilter, then one compiled alternation with named groups."""

    name = "secrets"

    def __init__(self) -> None:
        self._regex = re.compile("|".join(f"(?P<{k}>{p})" for k, p in _PATTERNS.items()))

    def classify(self, texts: Sequence[str]) -> list[Finding]:
        findings = []
        for index, text in enumerate(texts):
            if not any(literal in text for literal in _LITERALS):
                continue
            for match in self._regex.finditer(text):
                findings.append(Finding(match.lastgroup or "secret", index))
        return findings
