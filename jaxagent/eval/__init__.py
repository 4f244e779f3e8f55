"""The reporting protocol: success, steps, failure modes, env errors, multi-seed summaries
(``report``), and pass@k / pass^k for sampled code (``passk``)."""

from jaxagent.eval.report import EvalReport, seed_summary, summarize

__all__ = ["EvalReport", "seed_summary", "summarize"]
