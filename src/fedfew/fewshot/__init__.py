"""The few-shot building blocks: N-way K-shot episodes and their fixed evaluation sets, the learners
(MAML, ProtoNet) and their stacked form, evaluation, client partitions, label corruption and adversarial
clients. Importing the package runs none of them."""
