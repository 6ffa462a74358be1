"""The extension example of docs/extending.md works as documented."""

import pytest
import torch

from lightning_speedups import BatchFields, SpeedupCallback
from tests.helpers import MemoryLogger, RecordingModule, loaders, trainer


class InputNoise(SpeedupCallback):
    """Add Gaussian noise to the inputs during the first half of training (as in docs/extending.md)."""

    log_name = "input_noise"

    def __init__(self, std: float = 0.1, until: float = 0.5, input_key=None, seed=None):
        super().__init__(seed=seed)
        if std < 0:
            raise ValueError(f"`std` must be >= 0, got {std!r}.")
        self.std, self.until = std, until
        self.fields = BatchFields(input_key=input_key)

    def transform_batch(self, trainer, pl_module, batch):
        if self.progress(trainer) >= self.until:
            return batch
        x = self.fields.get_input(batch)
        noise = torch.randn(x.shape, generator=self.torch_generator(trainer)).to(x)
        return self.fields.replace(batch, input=x + self.std * noise)

    def knobs(self):
        return {"std": self.std}


def test_documented_extension_acts_in_its_window_and_logs():
    model, logger = RecordingModule(), MemoryLogger()
    train, _ = loaders("dict")
    trainer(
        callbacks=[InputNoise(std=0.5, input_key="image", seed=0)], max_epochs=2, logger=logger, log_every_n_steps=1
    ).fit(model, train)
    raw = [b["image"] for b in train] * 2
    changed = [not torch.equal(seen, r) for (seen, _), r in zip(model.train_batches, raw, strict=True)]
    assert changed == [True] * 4 + [False] * 4
    noise = model.train_batches[0][0] - raw[0]
    assert noise.std().item() == pytest.approx(0.5, rel=0.15)
    assert [v for _, v in logger.history["input_noise/std"]] == [0.5] * 8
    with pytest.raises(ValueError, match="`std` must be >= 0"):
        InputNoise(std=-1)
