"""fp8 (torchao): refusal paths and the converter's module filter (no torchao or GPU needed)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from precswitch import fp8
from precswitch.errors import PrecisionUnsupported, PrecswitchError


def test_cpu_is_refused_with_a_clear_message():
    with pytest.raises(PrecisionUnsupported) as e:
        fp8.check_fp8_supported(torch.device("cpu"))
    msg = str(e.value)
    assert "'fp8'" in msg and "'cpu'" in msg and "8.9" in msg and "pip install torchao" in msg
    assert isinstance(e.value, PrecswitchError)  # the CLI prints it as one line, exit 2


def test_old_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    with pytest.raises(PrecisionUnsupported, match=r"'fp8'.*A100.*8\.0"):
        fp8.check_fp8_supported(torch.device("cuda:0"))


def test_missing_torchao_is_refused_naming_pip(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(fp8, "torchao_available", lambda: False)
    with pytest.raises(PrecisionUnsupported, match=r"'fp8'.*H200.*pip install torchao"):
        fp8.check_fp8_supported(torch.device("cuda"))


def _bert(cls_name: str):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16, num_labels=2)
    return getattr(transformers, cls_name)(cfg)


def test_filter_on_masked_lm():
    model = _bert("BertForMaskedLM")
    names = fp8.fp8_candidates(model)
    assert "bert.encoder.layer.0.attention.self.query" in names
    assert "bert.encoder.layer.1.intermediate.dense" in names
    assert "bert.encoder.layer.1.output.dense" in names
    assert not any(n.startswith("cls") for n in names)  # MLM head (transform + tied decoder) stays high precision
    assert len(names) == 2 * 6  # q, k, v, attention out, FFN up, FFN down per layer


def test_filter_rejects_dims_not_multiple_of_16_and_non_linear():
    assert fp8.fp8_module_filter(nn.Linear(32, 48), "encoder.ffn")
    assert not fp8.fp8_module_filter(nn.Linear(32, 50), "encoder.ffn")
    assert not fp8.fp8_module_filter(nn.Linear(24, 32), "encoder.ffn")
    assert not fp8.fp8_module_filter(nn.LayerNorm(32), "encoder.norm")
    assert not fp8.fp8_module_filter(nn.Linear(32, 32), "classifier")
    assert not fp8.fp8_module_filter(nn.Linear(32, 32), "cls.predictions.decoder")
    assert fp8.fp8_module_filter(nn.Linear(32, 32), "classifier_like_name_but_not_head") is True


def _fake_torchao(monkeypatch) -> dict:
    """A torchao whose convert_to_float8_training records what it would convert (names the filter
    keeps) and the config it got, in the dict returned."""
    calls = {}

    def fake_convert(module, *, module_filter_fn=None, config=None):
        calls["converted"] = [n for n, m in module.named_modules() if module_filter_fn(m, n)]
        calls["config"] = config
        return module

    fake = SimpleNamespace(convert_to_float8_training=fake_convert)
    monkeypatch.setitem(sys.modules, "torchao", SimpleNamespace(float8=fake))
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    return calls


def test_converter_calls_torchao_with_the_filter(monkeypatch):
    calls = _fake_torchao(monkeypatch)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    assert fp8.convert_model_to_fp8(model) is model
    assert calls["converted"] == ["0"]
    with pytest.raises(PrecisionUnsupported, match="multiples of 16"):
        fp8.convert_model_to_fp8(nn.Sequential(nn.Linear(10, 3)))


def _gpu(monkeypatch, cap, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: cap)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)


@pytest.mark.parametrize("cap, name", [((8, 9), "NVIDIA L4"), ((9, 0), "NVIDIA H200"), ((12, 0), "NVIDIA B200")])
def test_ada_hopper_and_newer_with_torchao_are_accepted(monkeypatch, cap, name):
    """The docstring's floor is compute capability 8.9 (Ada) inclusive."""
    _gpu(monkeypatch, cap, name)
    monkeypatch.setattr(fp8, "torchao_available", lambda: True)
    fake = SimpleNamespace(float8=SimpleNamespace())
    monkeypatch.setitem(sys.modules, "torchao", fake)
    monkeypatch.setitem(sys.modules, "torchao.float8", fake.float8)
    assert fp8.check_fp8_supported(torch.device("cuda:0")) is None


def test_a_torchao_without_float8_is_refused_before_training(monkeypatch):
    """torchao present but torchao.float8 not importable (built for another torch): refused by the check,
    not at the conversion after the model was built."""
    _gpu(monkeypatch, (9, 0), "NVIDIA H200")
    monkeypatch.setattr(fp8, "torchao_available", lambda: True)
    monkeypatch.setitem(sys.modules, "torchao", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import torchao.float8 -> ImportError
    with pytest.raises(PrecisionUnsupported, match=r"'fp8': torchao is installed but torchao.float8 cannot be "
                                                   r"imported.*pip install torchao"):
        fp8.check_fp8_supported(torch.device("cuda"))


# ------------------------------------------------------------------ mutation audit 2 (plots/config/flops)


def test_a_given_filter_decides_alone_what_is_converted(monkeypatch):
    """With the caller's own filter the default candidates (dims % 16) do not matter: a model that has none is
    converted where that filter says so, not refused."""
    calls = _fake_torchao(monkeypatch)
    model = nn.Sequential(nn.Linear(10, 3))
    assert fp8.convert_model_to_fp8(model, module_filter_fn=lambda m, n: n == "0") is model
    assert calls["converted"] == ["0"]


# ------------------------------------------------------------------ mutation audit 6 (gpu_check/flops/fp8)
@pytest.mark.parametrize("fqn", ["lm_head", "lm_head.dense", "qa_outputs", "pooler.dense", "cls.predictions.decoder"])
def test_every_default_head_prefix_stays_in_high_precision(fqn):
    """HEAD_PREFIXES names the heads of other architectures too (a causal LM's lm_head, a QA model's qa_outputs, a
    bare BertModel's pooler): a 16-aligned Linear under any of them is not converted; the same layer elsewhere is."""
    lin = nn.Linear(32, 32)
    assert not fp8.fp8_module_filter(lin, fqn)
    assert fp8.fp8_module_filter(lin, "bert.encoder.layer.0." + fqn.split(".")[0])
