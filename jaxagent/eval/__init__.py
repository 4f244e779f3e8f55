"""The reporting protocol: success, steps, failure modes, env errors, multi-seed summaries
(``report``), pass@k / pass^k for sampled code (``passk``), bootstrap intervals, IQM,
stratified bootstrap and probability of improvement (``stats``), the evaluation record with
token cost and provenance (``protocol``), its Markdown table (``tables``), plots (``plots``,
matplotlib imported only when plotting) and the comparison of two records (``compare``)."""

from jaxagent.eval.report import EvalReport, seed_summary, summarize

__all__ = ["EvalReport", "seed_summary", "summarize"]
