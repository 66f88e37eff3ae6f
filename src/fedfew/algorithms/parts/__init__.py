"""What the registered algorithms share and each paper's parts: the common local training and
evaluation, FedAvg over episodes and its batched form, the optimisers, F2L's losses and models, FRL's
losses, options, rounds, tasks and deployment groups, the one-shot report. None of them registers an
algorithm; importing the package runs none of them."""
