"""Meta-learning building blocks shared by the episodic algorithms."""

from fedfew.meta.learners import MAML, EpisodicLearner, ProtoNet, proximal_term

__all__ = ["MAML", "EpisodicLearner", "ProtoNet", "proximal_term"]
