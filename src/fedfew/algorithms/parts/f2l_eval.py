"""F2L's meta-test as the authors' code runs it: logistic regression on the server-model's features."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["logistic_regression_accuracy"]

def logistic_regression_accuracy(support: torch.Tensor, support_labels: torch.Tensor, query: torch.Tensor,
                                 query_labels: torch.Tensor) -> float:
    """The authors' code's meta-test: multinomial logistic regression (C = 1, lbfgs) on l2-normalised
    server-model features of the support set, scored on the query set."""
    from sklearn.linear_model import LogisticRegression

    classifier = LogisticRegression(C=1.0, max_iter=1000, random_state=0)
    classifier.fit(F.normalize(support, dim=1).cpu().numpy(), support_labels.cpu().numpy())
    predicted = classifier.predict(F.normalize(query, dim=1).cpu().numpy())
    return float((torch.from_numpy(predicted) == query_labels.cpu()).float().mean())
