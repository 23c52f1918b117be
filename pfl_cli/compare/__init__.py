"""Comparisons a paper can print: runs grouped by configuration, mean and 95 % t-interval over seeds,
fairness across clients (``pflx compare``).

>>> from pfl_cli.compare import read_runs, compare          # doctest: +SKIP
>>> table = compare(read_runs(["runs/fedavg-s0", "runs/fedavg-s1"]))  # doctest: +SKIP
>>> print(table.markdown())                                  # doctest: +SKIP

The statistics (:mod:`pfl_cli.compare.stats`) are also what ``train`` and ``predict`` write into
``metrics.json`` (``accuracy_std``, ``accuracy_worst10``, ``accuracy_min``).
"""

from pfl_cli.compare.runs import ClientGroup, read_client_accuracies, read_runs
from pfl_cli.compare.stats import FAIRNESS_KEYS, client_fairness, mean_interval, worst_count
from pfl_cli.compare.table import Comparison, compare

__all__ = ["ClientGroup", "Comparison", "FAIRNESS_KEYS", "client_fairness", "compare", "mean_interval",
           "read_client_accuracies", "read_runs", "worst_count"]
