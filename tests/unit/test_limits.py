"""One truth for the settings' limits: every place that accepts a block size or an image budget
accepts exactly core.limits' values, and the texts users read name them."""

from __future__ import annotations

import argparse

import pytest
from support.fake_engine import FakeEngine

from app.cli import _block_size as cli_block_size
from app.tui.screens.settings import FieldError, parse_block_size
from core.limits import BLOCK_SIZE_RANGE, IMAGE_BUDGETS, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from core.model.image import SUPPORTED_SOFT_TOKENS
from core.settings import GenerationSettings
from core.user.config import DEFAULT_CONFIG_TEXT, ConfigError, validate

GOOD = [MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, "auto"]
BAD = [MIN_BLOCK_SIZE - 1, MAX_BLOCK_SIZE + 1]


def accepts_everywhere(k) -> list[bool]:
    """Whether the config file, the per-turn settings, the CLI, the settings screen and the fake
    engine accept block size `k`."""
    out = []
    try:
        validate({"block_size": k})
        out.append(True)
    except ConfigError:
        out.append(False)
    try:
        GenerationSettings(block_size=k).validate()
        out.append(True)
    except ValueError:
        out.append(False)
    try:
        cli_block_size(str(k))
        out.append(True)
    except argparse.ArgumentTypeError:
        out.append(False)
    try:
        parse_block_size(str(k))
        out.append(True)
    except FieldError:
        out.append(False)
    engine = FakeEngine()
    try:
        engine.set_block_size(k)
        out.append(True)
    except ValueError:
        out.append(False)
    finally:
        engine.close()
    return out


@pytest.mark.parametrize("k", GOOD)
def test_every_entry_point_accepts_the_block_size_range(k):
    assert accepts_everywhere(k) == [True] * 5


@pytest.mark.parametrize("k", BAD)
def test_every_entry_point_refuses_outside_the_range(k):
    assert accepts_everywhere(k) == [False] * 5


def test_image_budgets_agree():
    assert SUPPORTED_SOFT_TOKENS == IMAGE_BUDGETS
    for b in IMAGE_BUDGETS:
        GenerationSettings(image_budget=b).validate()
        assert validate({"image_budget": b}).image_budget == b
    with pytest.raises(ValueError):
        GenerationSettings(image_budget=IMAGE_BUDGETS[0] + 1).validate()
    with pytest.raises(ConfigError):
        validate({"image_budget": IMAGE_BUDGETS[0] + 1})


def test_the_default_config_file_names_the_limits():
    assert BLOCK_SIZE_RANGE in DEFAULT_CONFIG_TEXT
    assert ", ".join(map(str, IMAGE_BUDGETS[:-1])) + f" or {IMAGE_BUDGETS[-1]}" in DEFAULT_CONFIG_TEXT
