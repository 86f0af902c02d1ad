"""The learner: APPO and its maths, the side of training that runs in the Lightning process.

``policy`` (ActorCritic and the observation normalizer, also run by the collector), ``returns``
(V-trace, GAE and the episode masks on time-major tensors), ``losses`` (the loss terms as pure
functions) and ``appo`` (APPOModule, the LightningModule that puts them together). Pure torch on
rollout tensors: it reads batches from the runtime but never touches an env or shared memory.
"""
