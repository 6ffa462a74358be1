import logging
import os

import pytest


@pytest.fixture(autouse=True)
def _isolate(monkeypatch):
    """Keep Lightning's banners quiet and undo ``seed_everything``'s environment writes after each test."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    saved = os.environ.get("PL_GLOBAL_SEED")
    yield
    if saved is None:
        os.environ.pop("PL_GLOBAL_SEED", None)
    else:
        os.environ["PL_GLOBAL_SEED"] = saved
