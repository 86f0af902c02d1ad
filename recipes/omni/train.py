"""The multimodal recipe from a checkout: ``python recipes/omni/train.py fit --config FILE``."""

from lightning_omni.examples.multimodal_train import main

if __name__ == "__main__":
    main()
