"""``pipeline.host`` — reaching the hosts: SSH, the helper that runs there, and Slurm's login node.

:mod:`~pipeline.host.remote` (pooled SSH, argv quoted by :mod:`~pipeline.host.quoting`),
:mod:`~pipeline.host.helper` (sent to hosts, standard library only) with its typed contract
:mod:`~pipeline.host.contract` and the calls built on it :mod:`~pipeline.host.probe`, and
:mod:`~pipeline.host.slurm` (``sbatch``, ``squeue``, ``scancel``).

May import :mod:`pipeline.config`, :mod:`pipeline.errors` and :mod:`pipeline.fmt` only.
"""
