"""``pipeline.host`` — reaching the hosts: SSH, the helper that runs there, and Slurm's login node.

- remote execution over SSH, one pooled connection per host :mod:`~pipeline.host.remote`, and
  argv quoted for it :mod:`~pipeline.host.quoting`;
- the helper program sent to hosts :mod:`~pipeline.host.helper` (standard library only), its typed
  contract :mod:`~pipeline.host.contract`, and the calls and probes built on it
  :mod:`~pipeline.host.probe`;
- a Slurm cluster through its login node (``sbatch``, ``squeue``, ``scancel``)
  :mod:`~pipeline.host.slurm`.

May import the loose modules of :mod:`pipeline` (config, errors, fmt) only.
"""
