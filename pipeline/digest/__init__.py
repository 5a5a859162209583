"""``pipeline.digest`` — throughput digests: what a training job did since the last one.

- metric lines parsed from bytes :mod:`~pipeline.digest.metrics`; the window of the log a digest
  reads :mod:`~pipeline.digest.window`; statistics (pure) :mod:`~pipeline.digest.stats`; the
  digest itself :mod:`~pipeline.digest.report`; its chart :mod:`~pipeline.digest.chart`, drawn
  from its data (throughput broken at gaps, restarts, stragglers; pure) :mod:`~pipeline.digest.series`.

May import :mod:`pipeline.host`, :mod:`pipeline.observe`, :mod:`pipeline.state` and the loose
modules of :mod:`pipeline`.
"""
