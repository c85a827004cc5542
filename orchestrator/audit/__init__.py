"""Reading runs: what a run did (summary, history), whether its journal and snapshots agree
(verify), forks, retention (gc), cluster statistics, and the self-contained HTML report."""

from orchestrator.audit.audit import Audit
from orchestrator.audit.gc import GcReport
from orchestrator.audit.stats import Stats
from orchestrator.audit.summary import RunSummary
from orchestrator.audit.verify import VerifyProblem, VerifyReport

__all__ = [
    "Audit",
    "RunSummary",
    "VerifyReport",
    "VerifyProblem",
    "GcReport",
    "Stats",
]
