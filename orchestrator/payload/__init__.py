"""What may enter the journal: the JSON codec (no pickle), redaction of secrets, bounding of large
values, and exceptions as records."""

from orchestrator.payload.codec import canonical_dumps, dumps, loads
from orchestrator.payload.exceptions import error_record
from orchestrator.payload.redact import DEFAULT_PATTERNS, REDACTED, JournalRedactor, Redactor
from orchestrator.payload.truncate import bound_json

__all__ = [
    "dumps",
    "loads",
    "canonical_dumps",
    "Redactor",
    "JournalRedactor",
    "REDACTED",
    "DEFAULT_PATTERNS",
    "bound_json",
    "error_record",
]
