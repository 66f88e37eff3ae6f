"""fl-proto: FedAvg over Prototypical-Network episodes (the FL-Proto baseline of F2L, Table 1).

Each client trains a head-less encoder with the prototypical loss on episodes of its own data; the
server averages the encoders. Meta-test classifies queries by distance to support prototypes.
"""

from __future__ import annotations

from fedfew.algorithms.parts.episodic import EpisodicFedAvg, EpisodicOptions
from fedfew.interface.registration import register


@register("fl-proto", help="FedAvg over Prototypical-Network episodes")
class FLProto(EpisodicFedAvg[EpisodicOptions]):
    secure_sum = ""
    #: The model is a head-less encoder: it trains on episodes of any way (``episodes.train_way``).
    takes_training_way = True
