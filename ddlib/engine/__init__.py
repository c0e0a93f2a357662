"""The engine: the one training loop (``train``) and its hooks (``hooks``), augmentations (``augment/``), losses and online
relabelling (``labels``), adversarial-training objectives (``adversarial_training``) and devices
(``device``). It imports data and models only: nothing from tracking, protocols or the runner."""
