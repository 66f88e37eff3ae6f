"""FedFSL-MI-Adv (Fan & Huang 2021, section 4.2, eq. 14-16, Algorithm 2).

The model is a feature generator Theta (the zoo model's encoder, ``model.features``) and a classifier
theta (two fully connected layers with a ReLU, :func:`two_layer_classifier`). Only Theta and theta
are sent and averaged; at the start of every local update the client makes a second classifier
theta' that lives for that update only. Each local step samples ``meta_batch`` episodes and runs

* Stage 1 (eq. 15), Theta fixed: one Adam step on theta and theta' for
  L(theta) + L(theta') - eta * KL(p(theta) || p(theta')): both classifiers fit the episode while
  disagreeing as much as they can, which exposes query samples near the decision boundaries;
* Stage 2 (eq. 16), theta and theta' fixed: ``generator_steps`` Adam steps on Theta for
  L(theta) + L(theta') + lambda * KL(p(theta) || p(theta')): the generator moves those samples away
  from the boundaries, giving a more discriminative feature space for unseen classes.

L(.) is the MAML objective (eq. 6) of the model (Theta, .): the query loss after the inner-loop
adaptation on the support set (all parameters adapt in the inner loop, as in fl-maml; "fixed" means
the stage's optimiser does not step them), and p(.) are those adapted query predictions. The
mutual-information term of section 4.1, gamma * KL(p(w_g) || p(Theta, theta)), stays in both
stages' objectives (it is part of the local objective the stages split between their parameters);
eqs. 15-16 as printed have no MI term: ``stage_mi: false`` gives that form.

Where the paper is silent (options):

* ``generator_steps`` (default 1). The maximum-classifier-discrepancy method this follows (Saito et
  al. 2018) repeats its generator step 4 times, but its generator step minimises the discrepancy
  alone; here stage 2 also carries the FSL loss, so every generator step is a full meta-training step
  on the encoder. With 1, FedFSL-MI-Adv gives the encoder as many updates per episode as FedFSL-naive
  and FedFSL-MI do (a like-for-like comparison) and a local step costs 4 MAML losses instead of 10;
  4 is one option away.
* ``second_classifier`` (default "perturb"): theta' = theta + noise, the noise per tensor Gaussian
  with standard deviation ``perturb_std`` times that tensor's root mean square, drawn from the
  client's generator. Starting theta' at the current classifier keeps L(theta') as small as
  L(theta) from the first step (a fresh theta' every round would first have to relearn the task,
  and its large loss would dominate stage 2's update of the shared generator), while the noise
  breaks the symmetry: at theta' = theta exactly, the KL term and its gradient are zero and the two
  classifiers would receive identical updates forever. "fresh" draws a new seeded initialisation.
* Each stage's optimiser is Adam (``optimizer``, ``lr``), made fresh at every local update as in
  fl-maml; stage 2 reuses stage 1's episodes (as MCD reuses its minibatch).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from fedfew.algorithms.fedfsl import FedFSLMI, FedFSLMIOptions, prediction_kl
from fedfew.algorithms.parts.common import local_sampler, make_optimizer
from fedfew.algorithms.parts.episodic import EpisodicClientState
from fedfew.algorithms.parts.optimizers import LocalOptimizer
from fedfew.core.seeding import seed_torch_init
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.learners import proximal_term
from fedfew.interface.algorithm import ClientData, ClientResult, Context, Payload
from fedfew.interface.registration import register
from fedfew.interface.state import get_state, load_state_
from fedfew.models.base import FewShotModel


class FedFSLAdvOptions(FedFSLMIOptions):
    classifier: Literal["linear", "mlp"] = Field("mlp", description=(
        "theta: \"mlp\", the two-layer classifier (Linear -> ReLU -> Linear) on the generator's features "
        "(section 4.2), or \"linear\", the zoo model's linear N-way head"))
    eta: float = Field(0.1, ge=0.0, description="weight of the discrepancy that stage 1 maximises (eq. 15; "
                       "paper: 0.1)")
    lam: float = Field(0.1, ge=0.0, description="the paper's lambda: weight of the discrepancy that stage 2 "
                       "minimises (eq. 16; paper: 0.1)")
    generator_steps: int = Field(1, ge=1, description="generator (stage 2) steps per local step (the module "
                                 "docstring says why 1)")
    second_classifier: Literal["perturb", "fresh"] = Field("perturb", description=(
        "how theta' starts each local update: \"perturb\" (theta plus noise) or \"fresh\" (a new seeded init)"))
    perturb_std: float = Field(0.1, ge=0.0, description="noise scale of \"perturb\", relative to each tensor's "
                               "root mean square")
    stage_mi: bool = Field(True, description=(
        "keep the MI term gamma KL(p(w_g) || p(theta)) in both adversarial stages (ours: the stages split the "
        "local objective, which holds it); false: eqs. 15-16 as printed, which have no MI term"))


    @model_validator(mode="after")
    def _symmetry_broken(self) -> FedFSLAdvOptions:
        if self.second_classifier == "perturb" and self.perturb_std == 0:
            raise ValueError(
                "algorithm.options.perturb_std must be > 0 with second_classifier='perturb': theta' = theta "
                "exactly makes the discrepancy and its gradient zero, so the two classifiers never differ"
            )
        return self


@register("fedfsl-mi-adv", help="FedFSL-MI-Adv: MI term + two-stage classifier-discrepancy training (Alg. 2)")
class FedFSLMIAdv(FedFSLMI[FedFSLAdvOptions]):
    """FedFSL-MI-Adv (section 4.2, Algorithm 2)."""
    secure_sum = "with reference: global"
    secure_sum_refused = "reference: exclusive broadcasts w_{-k}, an average of the other clients' individual uploads"
    dp_refused = ("fedfsl-mi-adv with reference: exclusive broadcasts w_{-k}, an average of the other "
                  "clients' un-noised uploads (reference: global is covered)")

    def __init__(self, options: FedFSLAdvOptions, context: Context) -> None:
        super().__init__(options, context)
        # theta': a second head of the same shape, and a view (Theta, theta') sharing the encoder module.
        self.second_head = self.new_model().head
        self.second_view = FewShotModel(self.model.encoder, self.model.feature_dim, self.second_head)
        self.second_view.channels_last = self.model.channels_last

    def generator_parameters(self) -> list[nn.Parameter]:
        """Theta: the encoder's parameters."""
        return [p for p in self.model.encoder.parameters() if p.requires_grad]  # frozen word vectors stay out

    def classifier_parameters(self) -> list[nn.Parameter]:
        """theta and theta'."""
        return list(self.model.head.parameters()) + list(self.second_head.parameters())

    def init_second_classifier(self, generator: torch.Generator) -> None:
        """theta' for this local update (``second_classifier``), from the client's generator only."""
        opts = self.options
        with torch.no_grad():
            if opts.second_classifier == "fresh":
                seed_torch_init(generator)
                for module in self.second_head.modules():
                    reset_parameters = getattr(module, "reset_parameters", None)
                    if reset_parameters is not None:
                        reset_parameters()
                return
            for theta, theta2 in zip(self.model.head.parameters(), self.second_head.parameters()):
                rms = theta.pow(2).mean().sqrt()
                noise = torch.randn(theta.shape, generator=generator, dtype=theta.dtype, device=generator.device).to(theta.device)
                theta2.copy_(theta + opts.perturb_std * rms * noise)

    def adversarial_objective(
        self, episodes: list[Episode], references: list[torch.Tensor | None], discrepancy_weight: float,
        anchor: dict[str, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over episodes of L(theta) + L(theta') + discrepancy_weight * KL(p(theta) || p(theta'))
        + gamma * KL(p(w_g) || p(theta)), plus the proximal term when mu > 0. Stage 1 passes
        -eta (eq. 15), stage 2 +lambda (eq. 16)."""
        total = torch.zeros(())
        sums = {"loss": 0.0, "accuracy": 0.0, "loss_second": 0.0, "discrepancy": 0.0}
        for episode, reference in zip(episodes, references):
            loss, logits = self.learner.loss(self.model, episode)
            loss2, logits2 = self.learner.loss(self.second_view, episode)
            discrepancy = prediction_kl(logits, logits2)
            objective = loss + loss2 + discrepancy_weight * discrepancy
            if reference is not None and self.options.stage_mi:
                mi = prediction_kl(reference, logits)
                objective = objective + self.options.gamma * mi
                sums["mi_kl"] = sums.get("mi_kl", 0.0) + float(mi.detach())
            total = total + objective / len(episodes)
            sums["loss"] += float(loss.detach())
            sums["loss_second"] += float(loss2.detach())
            sums["discrepancy"] += float(discrepancy.detach())
            sums["accuracy"] += float((logits.argmax(-1) == episode.query_labels).float().mean())
        if anchor is not None:
            total = total + proximal_term(self.model, anchor, self.options.mu)
        return total, {k: v / len(episodes) for k, v in sums.items()}

    @staticmethod
    def step_on(objective: torch.Tensor, params: list[nn.Parameter], optimizer: LocalOptimizer) -> None:
        """One optimiser step on ``params`` only: the other parameters get no gradient and no update."""
        grads = torch.autograd.grad(objective, params)
        for p, g in zip(params, grads):
            p.grad = g
        optimizer.step()
        for p in params:
            p.grad = None

    def stage_one(self, episodes: list[Episode], references: list[torch.Tensor | None],
                  optimizer: LocalOptimizer, anchor: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Eq. 15: update theta and theta' (Theta fixed) to fit the episodes and maximise their discrepancy."""
        objective, metrics = self.adversarial_objective(episodes, references, -self.options.eta, anchor)
        self.step_on(objective, self.classifier_parameters(), optimizer)
        return metrics

    def stage_two(self, episodes: list[Episode], references: list[torch.Tensor | None],
                  optimizer: LocalOptimizer, anchor: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Eq. 16: update Theta (theta, theta' fixed) to fit the episodes and minimise the discrepancy."""
        objective, metrics = self.adversarial_objective(episodes, references, self.options.lam, anchor)
        self.step_on(objective, self.generator_parameters(), optimizer)
        return metrics

    def client_update(self, payload: Payload, state: EpisodicClientState | None, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        """Algorithm 2's client side: theta' anew, then per local step stage 1 and stage 2."""
        opts = self.options
        sampler = local_sampler(data.train, self.context.episode)
        if sampler is None:  # too little data for any episode: sit this round out
            return ClientResult.sat_out(state, data.num_samples)
        model = load_state_(self.model, payload["model"]).train()
        load_state_(self.reference_model, self.reference_state(payload)).train()
        self.init_second_classifier(generator)
        anchor = {k: v.clone() for k, v in payload["model"].items()} if opts.mu > 0 else None
        classifier_optimizer = make_optimizer(opts.optimizer, self.classifier_parameters(), opts.lr,
                                              weight_decay=opts.weight_decay)
        generator_optimizer = make_optimizer(opts.optimizer, self.generator_parameters(), opts.lr,
                                             weight_decay=opts.weight_decay)
        sums: dict[str, float] = {}
        for _ in range(opts.local_steps):
            episodes = [sampler.sample(generator) for _ in range(opts.meta_batch)]
            references = [self.reference_logits(ep) if opts.gamma > 0 else None for ep in episodes]
            metrics = self.stage_one(episodes, references, classifier_optimizer, anchor)
            for _ in range(opts.generator_steps):
                self.stage_two(episodes, references, generator_optimizer, anchor)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        return ClientResult(
            upload={"model": get_state(model)},  # Theta and theta only; theta' stays on the client
            state=state,
            metrics={k: v / opts.local_steps for k, v in sums.items()},
            num_samples=data.num_samples,
            num_episodes=opts.local_steps * opts.meta_batch,
        )
