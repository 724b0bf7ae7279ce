"""core.settings: the TOML file the console and the CLI share (KDB_CONFIG points each test at tmp)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from core.errors import InputError
from core.settings import Settings, load_settings, save_settings, settings_path


def test_defaults_without_a_file_and_kdb_config_names_the_file():
    assert settings_path() == Path(os.environ["KDB_CONFIG"])
    assert not settings_path().exists()
    assert load_settings() == Settings()


def test_save_then_load_round_trips_every_field():
    settings = Settings(archs=["sm_80", "sm_90a"], product_name="NVIDIA H200", nvcc_path="/opt/cuda/bin/nvcc",
                        nvcc_flags=["-lineinfo", "-Xptxas", "-O3"], nvcc_timeout_s=30.5, gpu_timeout_s=5,
                        workers=4, tune_trials=1000, tune_builder_timeout_s=300, rpc_tracker="10.0.0.2:9190",
                        rpc_key="h200")
    path = save_settings(settings)
    assert path == settings_path()
    assert load_settings() == settings
    assert tomllib.loads(path.read_text())["product_name"] == "NVIDIA H200"
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []  # atomic: no leftovers


def test_unknown_keys_are_ignored_and_ints_are_accepted_for_seconds():
    settings_path().write_text('future_key = 1\nnvcc_timeout_s = 30\narchs = ["sm_80"]\n')
    loaded = load_settings()
    assert loaded.nvcc_timeout_s == 30.0 and isinstance(loaded.nvcc_timeout_s, float)
    assert loaded.archs == ["sm_80"]


@pytest.mark.parametrize("text", ['workers = "four"', "archs = \"sm_80\"", "product_name = 3", "archs = ["])
def test_a_bad_file_is_refused_with_the_path(text: str):
    settings_path().write_text(text + "\n")
    with pytest.raises(InputError) as info:
        load_settings()
    assert info.value.where == str(settings_path())


@pytest.mark.parametrize(("field", "value"), [
    ("archs", []),
    ("archs", ["compute_90"]),
    ("archs", ["sm_1000"]),
    ("product_name", "H200;x"),
    ("product_name", "H200:x"),
    ("nvcc_timeout_s", 0.0),
    ("gpu_timeout_s", 100000.0),
    ("tune_builder_timeout_s", -1.0),
    ("workers", 257),
    ("tune_trials", 0),
    ("rpc_tracker", "no-port"),
])
def test_validate_names_the_bad_field(field: str, value: object):
    settings = Settings(**{field: value})
    with pytest.raises(InputError) as info:
        settings.validate()
    assert info.value.where == field


def test_save_refuses_a_bad_value_and_keeps_the_file():
    path = save_settings(Settings(archs=["sm_80"]))
    before = path.read_bytes()
    with pytest.raises(InputError):
        save_settings(Settings(archs=["sm_80"], product_name="a;b"))
    assert path.read_bytes() == before


def test_a_bad_value_in_the_file_is_refused_on_load():
    settings_path().write_text('archs = ["sm_80"]\nrpc_tracker = "nowhere"\n')
    with pytest.raises(InputError) as info:
        load_settings()
    assert info.value.where == "rpc_tracker"
