"""fl-maml (FedFSL-naive): FedAvg over MAML local updates (FedFSL, Algorithm 1, eq. 4-10).

Local update: for each outer step, sample an episode from the client's data, adapt the model on the
support set with ``inner_steps`` steps of size alpha (eq. 5), take the query loss at the adapted
parameters (eq. 6) and step Adam on its gradient (eq. 7-8), second order unless ``first_order``.
Aggregation: weighted by the number of episodes |B_k| (eq. 10).
"""

from __future__ import annotations

from fedfew.algorithms.parts.episodic import EpisodicFedAvg, MAMLOptions
from fedfew.interface.registration import register


@register("fl-maml", help="FedFSL-naive: FedAvg over MAML episodes (second or first order)")
class FLMAML(EpisodicFedAvg[MAMLOptions]):
    secure_sum = ""
