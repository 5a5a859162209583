"""``pipeline.digest`` — throughput digests: what a training job did since the last one: the log
window read (``window``), statistics over its metric lines (``stats``; the lines are
:mod:`pipeline.observe.metrics`'), the digest (``report``) and its chart with the chart's data
(``chart``).

May import :mod:`pipeline.config`, :mod:`pipeline.host`, :mod:`pipeline.observe`,
:mod:`pipeline.state`, :mod:`pipeline.errors`, :mod:`pipeline.fmt` and :mod:`pipeline.verdict` only.
"""
