"""``pipeline.digest`` — throughput digests: what a training job did since the last one: metric
lines (``metrics``), the log window read (``window``), statistics (``stats``), the digest
(``report``), its chart (``chart``) and the chart's data (``series``).

May import :mod:`pipeline.host`, :mod:`pipeline.observe`, :mod:`pipeline.state` and the loose
modules of :mod:`pipeline`.
"""
